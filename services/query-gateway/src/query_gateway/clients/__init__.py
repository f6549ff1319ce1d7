"""Who the gateway talks to: the ds connector, the filter-resolver, the flows database (pull
grants), the OIDC issuer, the broker (disclosures), Redis (rate limits); and what it remembers of
their answers (decisions, verified tokens)."""
