"""One AIBrix request on its way to EIC: checks and region holds, the direct path, dispatch, statuses, exists."""
