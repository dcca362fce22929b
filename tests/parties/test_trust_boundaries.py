"""Trust boundaries, second pass: no single-noise studies, one server per port and per data directory."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import numpy as np
import pytest

from he_partition.errors import InvalidInputError
from parties.common.config import DecryptionConfig, ComputationConfig
from parties.common.contract import StudyContract
from parties.common.errors import DPAggError, ServiceError
from parties.computation.server import create_computation_server
from parties.decryption.server import create_decryption_server

from .conftest import Cluster


def test_a_study_refuses_a_single_noise_party(cluster: Cluster) -> None:
    with pytest.raises(InvalidInputError, match="knows its own draw"):
        StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=("a",), noise_parties=1,
                             context_fingerprint="0" * 64)
    with pytest.raises(ServiceError) as ei:
        cluster.computation().open_study(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=["a"],
                                         noise_parties=1)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "noise_parties" in ei.value.details


def test_a_second_server_on_a_port_in_use_refuses_to_start(tmp_path: Path) -> None:
    first = create_decryption_server(DecryptionConfig(tmp_path / "ds1", insecure=True)).start()
    try:
        with pytest.raises(InvalidInputError, match="port in use"):
            create_decryption_server(DecryptionConfig(tmp_path / "ds2", port=first.port, insecure=True))
        with pytest.raises(InvalidInputError, match="port in use"):
            create_computation_server(ComputationConfig(tmp_path / "cs", first.target, port=first.port,
                                                        insecure=True))
    finally:
        first.stop()
    # The refused servers released their data directories.
    again = create_decryption_server(DecryptionConfig(tmp_path / "ds2", insecure=True))
    again.stop()


def test_two_servers_on_one_data_directory_refuse(tmp_path: Path) -> None:
    first = create_decryption_server(DecryptionConfig(tmp_path / "ds", insecure=True)).start()
    try:
        with pytest.raises(DPAggError, match="in use by another decryption server"):
            create_decryption_server(DecryptionConfig(tmp_path / "ds", insecure=True))
        cs = create_computation_server(ComputationConfig(tmp_path / "cs", first.target, insecure=True))
        try:
            with pytest.raises(DPAggError, match="in use by another computation server"):
                create_computation_server(ComputationConfig(tmp_path / "cs", first.target, insecure=True))
        finally:
            cs.stop()
    finally:
        first.stop()
    create_decryption_server(DecryptionConfig(tmp_path / "ds", insecure=True)).stop()  # free again after stop
