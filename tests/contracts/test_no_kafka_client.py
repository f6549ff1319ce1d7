"""The contracts library is shapes only (docs/wire-contracts.md): it declares no Kafka client and
importing every one of its modules loads none. The topics command lives in the service kit."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import dataplane_contracts

KAFKA_CLIENTS = ("aiokafka", "kafka-python", "confluent-kafka", "faststream")


def test_the_contracts_distribution_declares_no_kafka_client() -> None:
    declared = [r.split(";")[0].strip().lower() for r in requires("dataplane-contracts") or []]
    assert declared  # read from the installed metadata: pydantic and friends are listed
    assert not [r for r in declared if r.startswith(KAFKA_CLIENTS)]


def test_importing_every_contracts_module_loads_no_kafka_client() -> None:
    package = Path(dataplane_contracts.__file__).parent
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert "topics" in modules and "topics_cli" not in modules
    script = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('dataplane_contracts.' + m)\n"
        "print(','.join(sorted(n for n in sys.modules if 'kafka' in n or 'faststream' in n)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == ""
