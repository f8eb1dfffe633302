"""What every HTTP server dart runs shares (the SQL endpoint, `dart serve`, /metrics, the guest
agent): connection limits (:mod:`.httplimits`) and the Host/Origin check (:mod:`.hostcheck`).
Light on purpose: the guest agent, which a VM runs, imports it without the bus or the store."""
