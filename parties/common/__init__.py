"""What the parties share: configuration, server bootstrap, status mapping, TLS identities and signatures."""
