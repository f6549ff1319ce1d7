"""The records API on the DPS pull path (docs/records.md): `GET /dps/public/streams/{dataset}`,
`GET /dps/public/streams/{dataset}/records` with the flow's frozen client range filters, keyset
cursors, and the protected-resource metadata."""
