"""dpagg.v1 messages and service stubs, generated from proto/dpagg/v1/*.proto; do not edit."""
