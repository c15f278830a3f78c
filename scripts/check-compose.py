"""Parses docker-compose.yml and checks it offers every server the tests use."""
import yaml

with open("docker-compose.yml") as f:
    services = yaml.safe_load(f)["services"]
wanted = {"redis", "etcd", "zookeeper", "postgres", "mariadb"} | {f"redlock-{i}" for i in range(1, 6)}
missing = wanted - set(services)
assert not missing, f"docker-compose.yml lacks {sorted(missing)}"
for name, svc in services.items():
    assert "image" in svc and "ports" in svc, f"service {name} needs an image and ports"
print(f"docker-compose.yml: {len(services)} services parse")
