//! The stored procedures the backend creates with its tables.

use sqlx::mysql::MySqlDatabaseError;

/// A stored procedure the backend creates with its tables.
pub(crate) struct Procedure {
    /// Its body, as `information_schema.ROUTINES` shows it.
    body: String,
    /// Reads the body stored now.
    definition: String,
    create: String,
    drop: String,
}

impl Procedure {
    /// `name(params)` running `body`.
    pub(crate) fn new(name: &str, params: &str, body: String) -> Self {
        Self {
            definition: format!(
                "SELECT ROUTINE_DEFINITION FROM information_schema.ROUTINES
                  WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE'
                    AND ROUTINE_NAME = '{name}'"
            ),
            create: format!(
                "CREATE PROCEDURE {name}({params})
                 MODIFIES SQL DATA
                 {body}"
            ),
            drop: format!("DROP PROCEDURE IF EXISTS {name}"),
            body,
        }
    }

    /// Creates the procedure, or drops and creates it again if its body is
    /// not this version's; left alone if it is, or if this role cannot
    /// read its body (another role owns it). Clients starting together may
    /// both create it: the one that finds it created meanwhile (error 1304)
    /// is done too.
    pub(crate) async fn ensure(&self, pool: &sqlx::MySqlPool) -> Result<(), sqlx::Error> {
        let found: Option<Option<String>> = sqlx::query_scalar(&self.definition)
            .fetch_optional(pool)
            .await?;
        match found {
            Some(None) => return Ok(()),
            Some(Some(body)) if body == self.body => return Ok(()),
            Some(Some(_)) => {
                sqlx::raw_sql(&self.drop).execute(pool).await?;
            }
            None => {}
        }
        match sqlx::raw_sql(&self.create).execute(pool).await {
            Err(e) if mysql_error_number(&e) == Some(1304) => Ok(()),
            other => other.map(|_| ()),
        }
    }
}

pub(crate) fn mysql_error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}
