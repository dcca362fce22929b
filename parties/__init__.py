"""The dpagg parties as gRPC services: data owner, computation, decryption and analyst roles, and the CLI."""
