"""The hand-out: who is handed which item, and for how long.

- `rule`: what the annotation queue may hand a person (open items with a free overlap slot,
  gold items, what their standing allows) and in what order (the run's selection rule);
- `lease`: the claim that leases the rule's items (one live assignment a slot), skips, the
  leases a label closes, and the reaping of abandoned ones;
- `queue`: the person's queue as it stands and the one count of what waits for them;
- `holds`: a group a person has open waits for them rather than training under their hands;
- `expiry`: the wait windows' end, a group's fallback when people did not come.

The modules import each other's public names only; nothing here imports a kind's module.
"""
