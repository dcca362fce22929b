"""dpagg.v1 messages and service stubs (parties.wire.v1), generated from proto/dpagg/v1/*.proto; do not edit."""
