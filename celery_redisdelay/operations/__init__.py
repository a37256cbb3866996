"""What an operator sees and does: listings, actions on many calls, metrics, checks and the validation.

The logic behind the command line and the dashboard, as plain functions over an app's store: :mod:`.admin`
(status, one call, dead letters), :mod:`.listing` (bounded pages over every shard), :mod:`.actions`
(cancel, requeue, reschedule by selection or filter), :mod:`.payloads` (a stored call made readable),
:mod:`.metrics`, :mod:`.checks` (what can lose calls), :mod:`.validation`, :mod:`.humanize`.
"""
