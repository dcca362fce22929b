"""Generated gRPC/protobuf code of the dpagg wire protocol (regenerate with scripts/gen_protos.py)."""
