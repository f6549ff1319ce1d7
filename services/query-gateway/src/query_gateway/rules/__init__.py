"""What is decided without I/O: the caller's policy, ds's verdicts judged (RF-01, RF-02, RF-06),
the catalogue's row-filter layers applied in process."""
