"""The parties' wire format in Python: `parties.wire.v1` holds the messages and service stubs generated
from proto/dpagg/v1/*.proto (proto package `dpagg.v1`; regenerate with scripts/gen_protos.py).

It imports only protobuf and grpc: every party, the SDK's clients and the tests import it, and it
imports none of them.
"""
