"""One key-share holder of the threshold mode: a decryption server that holds one share of the key.

What it holds:

- `holder`: one holder's decision for a share (contract, its own ledger charged first, one share
  per ciphertext, the share itself), from its own state only.
- `service`: the holder's state: its key store, its side of the collective key setup, and its
  share decisions over whole measurements.
- `servicer`: the `dpagg.v1.Decryption` service in key-share mode and the server that runs it.
- `client`: the client the computation server uses to reach one holder (setup and share RPCs).
- `uploads`: the owners' signed c1 parts and the expected c1 of every chunk; kept by every
  holder and by the single decryption server, and used by owners to sign their c1.
- `charges`: a t-of-N study's signed charge log: the holder's rules for signing a charge and for
  answering a request (also read by the computation server, which keeps the log).
- `resharing`: the t-of-N setup's dealing round on the wire (sub-shares sealed and signed).
- `join_planes`: a join study's indicator planes, taken only as their owners signed them (the holder computes
  the join's values from them itself: `he_partition.join.holders`).
- `share_workers`: a large measurement's shares computed on the holder's local worker processes
  (the decryption server's pool, each worker reading the key share from the holder's key store).

May import `parties.common`, the single decryption server's modules beside it
(`parties.decryption`: handler, keys, ledger, receipts, commitments, servicer, client, workers),
`he_partition` (core, `he.threshold`, protocol) and the generated `parties.wire.v1` stubs; nothing from
the computation server, data owners or analysts.

Privacy promise: a holder never serves its secret share, and it issues a decryption share only
after its own checks pass: the contract, its own budget ledger charged first, one share per
ciphertext, and a c1 equal to the owners' signed aggregate. So no relay, and no coalition short
of every holder, decrypts anything the DP release did not pay for. With a t-of-N key the same holds
for coalitions short of t holders, and a share is issued only for a charge t holders signed on the
study's whole log (no routing overspends while 2t - N exceeds the holders colluding with the relay).
"""
