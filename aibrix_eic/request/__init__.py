"""One AIBrix request on its way to EIC: checks, region holds, the direct path, dispatch, statuses, exists."""
