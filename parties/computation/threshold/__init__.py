"""The computation server's side of the threshold mode: K key-share holders in place of one decryption server.

What it holds:

- `decryption`: `ThresholdDecryption`, the decryption client's interface over K holders: it sends
  each measurement's chunks to every holder, combines only when all K shares are in, opens
  studies at every holder, and relays the collective key setup.
- `charge_log`: with a t-of-N key, each study's signed charge log as this server keeps it, and the
  round in which the participants of a measurement sign its charge.
- `upload_close`: with a t-of-N key, a sealed study's uploads closed with any t holders up (the
  owners split their upload keys t-of-N), and the holders that missed the close closed on the same
  set before they take the owners' c1 parts.
- `c1_forward`: the owners' c1 signatures as they arrive, and each included owner's signed c1
  parts forwarded to the key holders before a signed study's first measurement (also used
  with the single decryption server for signed studies).

May import `parties.common`, the computation server's modules beside it (`parties.computation`),
the decryption clients and the shared upload records (`parties.decryption.client`,
`forwarding`, `keyshare.client`, `keyshare.uploads`, `keyshare.charges`, `keyshare.resharing`), `he_partition` (core, `he.bfv`,
`he.threshold`) and the generated `parties.wire.v1` stubs; never a holder's decision, ledger or keys.

Privacy promise: this server never holds a secret key share. It combines shares only when every
holder answered (n-of-n), or, with a t-of-N key, when the t participants its signed charge fixed
answered; it relays the holders' key sub-shares sealed and never opens them; and it adds its noise to c0 only, so the holders check every chunk's
c1 against the owners' signed parts; nothing it forwards is secret (c1 alone carries no
plaintext).
"""
