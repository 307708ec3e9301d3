#!/usr/bin/env python3
"""Write deploy/monitoring/rules.yml, the plain-Prometheus rule file, from
the PrometheusRule beside it (its `spec.groups`), so the two never differ:

    python scripts/prometheus_rules.py          # rewrites rules.yml
    python scripts/prometheus_rules.py --check  # exit 1 if rules.yml is stale

tests/tools/test_deploy.py runs the check and promtool-like checks on both.
"""

import sys
from pathlib import Path

import yaml

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"
SOURCE = MONITORING / "prometheusrule.yaml"
TARGET = MONITORING / "rules.yml"
HEADER = """\
# Generated from prometheusrule.yaml by scripts/prometheus_rules.py: edit
# that file and rerun the script. The same alert rules for a Prometheus
# without the Operator: list this file under rule_files in prometheus.yml.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None  # multi-line PromQL stays readable
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render() -> str:
    rule = yaml.safe_load(SOURCE.read_text())
    body = yaml.dump({"groups": rule["spec"]["groups"]}, Dumper=_Dumper, sort_keys=False, width=100)
    return HEADER + body


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if TARGET.read_text() != text:
            print(f"{TARGET} is stale: run python scripts/prometheus_rules.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
