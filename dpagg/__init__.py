"""dpagg's Python SDK, one import away: the four clients, the TLS files they need, one exception family.

    import dpagg

    tls = dpagg.TlsConfig.in_directory("pki", "alice")      # what `dpagg certs` wrote for alice
    with dpagg.AnalystClient("localhost:50052", tls=tls) as analyst:
        latest = analyst.list_releases("ages")[0]
        frame = analyst.range_counts(latest.release_id, [(0, 10), (10, 50)]).to_pandas()

- Clients, one per role: `ComputationClient` (operator: studies, releases, direct range
  counts), `DataOwnerClient` (encrypt and upload), `AnalystClient` (released summaries),
  `DecryptionClient` (budget, public key). Each is a context manager (`with ... as c:`
  gives back the client, typed), and every public method is documented.
- Errors: everything the SDK raises on purpose is a `DPAggError`. A call the server refused
  is a `ServiceError` (`.code` a `grpc.StatusCode`, `.details` the server's message); a
  check made before any network traffic raises the specific subclass (`InvalidInputError`,
  `PermissionDeniedError`, ...); `code_of(exc)` gives the status code of either.
  (`SubmitInterrupted`, Ctrl-C during an upload, is a KeyboardInterrupt.)
- Results: `Summary.to_pandas()`, `Release.to_pandas()` (labelled with the bins' values), range
  answers' `.to_pandas()` and `join_table_frame(summary)` give pandas DataFrames; pandas is optional
  (`pip install 'dpagg[pandas]'`). `Summary.plot()` / `Release.plot()` draw one (matplotlib, optional).
- Before spending: `accuracy_preview(domain_size, epsilon, lengths)` (or `study_accuracy(contract)`)
  gives the expected error and interval of a range of each length, from the strategy's own design.
- Local files: `read_histogram` (a CSV of records, or a pandas DataFrame -> a contribution-bounded histogram, with
  `DomainSpec` and `ContributionBounds`), `write_sample_csv` (synthetic records to try it on),
  `generate_signing_key` / `save_private_key` / `load_private_key` (an owner's Ed25519 key).

This package sits on top: it imports the parties' clients and the core, and nothing under
`parties/` or `he_partition/` imports it (the servers' generated gRPC code is `parties.wire.v1`).
Names here are imported on first use, so `import dpagg` is cheap and loads no HE library.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from he_partition.core.errors import BudgetExhaustedError, DPAggError, InvalidInputError
    from he_partition.core.summary import RangeCount, RangeCounts, Summary
    from parties.analyst.client import AnalystClient, Release, ReleaseInfo
    from parties.common.config import RetryPolicy
    from parties.common.errors import (AlreadyExistsError, FailedPreconditionError, NotFoundError,
                                       PermissionDeniedError, ServiceError, code_of)
    from parties.common.signing import generate_signing_key, load_private_key, save_private_key
    from parties.common.tls import TlsConfig
    from parties.computation.client import ComputationClient, DirectAnswers, ReleaseStatus, StudyStatus
    from parties.data_owner.client import DataOwnerClient, SubmitInterrupted, SubmitResult
    from parties.data_owner.dataset import ContributionBounds, read_histogram, write_sample_csv
    from parties.data_owner.domain import DomainSpec
    from parties.decryption.client import DecryptionClient
    from he_partition.methods.accuracy import AccuracyPreview, RangeAccuracy, accuracy_preview
    from parties.analyst.value_ranges import ValueRange
    from parties.common.accuracy import study_accuracy

    from ._frames import join_table_frame

#: Public name -> the module that defines it.
_EXPORTS = {
    "ComputationClient": "parties.computation.client",
    "StudyStatus": "parties.computation.client",
    "ReleaseStatus": "parties.computation.client",
    "DirectAnswers": "parties.computation.client",
    "DataOwnerClient": "parties.data_owner.client",
    "SubmitResult": "parties.data_owner.client",
    "SubmitInterrupted": "parties.data_owner.client",
    "AnalystClient": "parties.analyst.client",
    "Release": "parties.analyst.client",
    "ReleaseInfo": "parties.analyst.client",
    "DecryptionClient": "parties.decryption.client",
    "TlsConfig": "parties.common.tls",
    "RetryPolicy": "parties.common.config",
    "DPAggError": "he_partition.core.errors",
    "InvalidInputError": "he_partition.core.errors",
    "BudgetExhaustedError": "he_partition.core.errors",
    "ServiceError": "parties.common.errors",
    "NotFoundError": "parties.common.errors",
    "PermissionDeniedError": "parties.common.errors",
    "AlreadyExistsError": "parties.common.errors",
    "FailedPreconditionError": "parties.common.errors",
    "code_of": "parties.common.errors",
    "Summary": "he_partition.core.summary",
    "RangeCount": "he_partition.core.summary",
    "RangeCounts": "he_partition.core.summary",
    "join_table_frame": "dpagg._frames",
    "read_histogram": "parties.data_owner.dataset",
    "DomainSpec": "parties.data_owner.domain",
    "ContributionBounds": "parties.data_owner.dataset",
    "write_sample_csv": "parties.data_owner.dataset",
    "generate_signing_key": "parties.common.signing",
    "save_private_key": "parties.common.signing",
    "load_private_key": "parties.common.signing",
    "accuracy_preview": "he_partition.methods.accuracy",
    "AccuracyPreview": "he_partition.methods.accuracy",
    "RangeAccuracy": "he_partition.methods.accuracy",
    "study_accuracy": "parties.common.accuracy",
    "ValueRange": "parties.analyst.value_ranges",
}

__all__ = ["AccuracyPreview", "AlreadyExistsError", "AnalystClient", "BudgetExhaustedError", "ComputationClient", "ContributionBounds",
           "DPAggError", "DataOwnerClient", "DecryptionClient", "DirectAnswers", "DomainSpec",
           "FailedPreconditionError", "InvalidInputError", "NotFoundError", "PermissionDeniedError", "RangeCount",
           "RangeCounts", "Release", "ReleaseInfo", "ReleaseStatus", "RetryPolicy", "ServiceError", "StudyStatus",
           "SubmitInterrupted", "SubmitResult", "Summary", "TlsConfig", "ValueRange", "RangeAccuracy",
           "accuracy_preview", "code_of", "generate_signing_key", "join_table_frame", "load_private_key",
           "read_histogram", "save_private_key", "study_accuracy", "write_sample_csv"]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dpagg' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
