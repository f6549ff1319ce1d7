"""DEVELOPMENT DOUBLES of systems this project does not own (OIDC issuer, ds connector, REC
registry, a control plane). They are small real HTTP servers for the local stack and the tests;
never deploy them."""
