"""``draftsmith doctor``: why is a run's acceptance low? Each check measures one known cause from the run's own
artifacts (records, data, features manifest, training checkpoint and log, export, eval report) or the live server,
and the findings are ranked by the acceptance each is likely costing (docs/doctor.md)."""
