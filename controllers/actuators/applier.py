"""``EdgeActuator``: one target (a listener on an edge) driven by decisions, with every safety rule.

Order of the checks for ``apply(decision)`` (each outcome audited, counted, logged):

1. not this target's listener/edge, an origin with a share > 0 the target does not serve, or a version or
   epoch beyond the record's ranges or shares that are no distribution (a record built without validation:
   a decoded one is refused at decode) -> ``refused``; an ``epoch`` (a controller's start time) more than
   ``max_clock_skew_s`` ahead of this host's clock -> ``refused`` (never the version in force: applied, it
   outranked every real decision for good, a controller started a year ahead or a hand-made record; the
   history's entries of that kind order nothing, store.py);
2. ``computed_at`` further in the future than ``max_clock_skew_s`` -> ``refused`` (a wrong clock
   must not make a decision look fresh); older than ``stale_after_s`` -> ``held`` (fail static), but
   ``stale_version`` when live and a newer version is applied (a replayed copy says nothing about now);
3. stamp ``(epoch, version)`` lower than the highest applied -> ``stale_version``; equal and fully
   applied -> ``noop`` (nothing written); an unreadable history -> ``held`` (fail static);
4. read the live weights and which origins the LB reports DOWN (either unreadable -> ``failed``, retried
   by the service with back-off: an unknown health view is not "nothing DOWN");
5. the decision (or the step-bounded weights) gives nothing to the origins the LB does not report
   DOWN -> ``refused`` and the live weights held ("never all-zero" counts only servers that can
   serve); bounded step from the live shares (an origin with share 0 that the LB reports DOWN is
   released at once), integer mapping. A quiescing target (LVS: keepalived/ldirectord set a dead real
   to weight 0; live 0 where the stored weight is above 0) reports those origins DOWN; they are
   stepped from their stored weight and written as 0 whatever the decision gives them (reconcile and
   rollback too), so only the health checker revives them; the intended weight is stored. A 0 that a
   write of ours may have set (one not read back and recorded: a ``mismatch``, a torn batch, a crash
   before the entry; noted in the store before the write starts) is no quiesce: that origin is not DOWN;
6. dry-run -> ``dry_run`` (nothing written); shadow -> ``shadow`` and ``opsloop_actuator_shadow_diff``;
7. write as one batch (a failed write whose read-back leaves nothing serving puts the weights read
   before back, best effort, said in the ``failed`` record), read back, compare (different ->
   ``mismatch``), store the entry -> ``applied``.

Every LB write (apply, reconcile, rollback) is preceded by a write-ahead intent (store.py: before, after, the
entry), removed once its outcome is audited. One left by a kill is resolved before the next action: audited with
its real before/after (``applied`` and its entry recorded if the changed weights are live, else ``failed``).
"""

from __future__ import annotations

import math
import time
from typing import Callable

from opsloop.audit.trail import AuditLog
from opsloop.records import AuditMode
from opsloop.log import get_logger

from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.base import ActuatorError, ApplyResult, Target
from opsloop.controllers.actuators.mapping import MappingError, to_integer_weights, to_shares
from opsloop.controllers.actuators.safety import bound_step, reaches, share_difference
from opsloop.controllers.actuators.store import Entry, Intent, Stamp, StoreError, WeightStore
from opsloop.records import EdgeWeights
from opsloop.records.edge import LAST_EPOCH, MAX_VERSION, check_shares

log = get_logger("actuator")

_MODES = {"live": AuditMode.LIVE, "dry-run": AuditMode.DRY_RUN, "shadow": AuditMode.SHADOW}


class EdgeActuator:
    def __init__(self, target: Target, edge: str, listener: str, store: WeightStore, audit: AuditLog, *,
                 mode: str = "live", max_step: float = 0.5, stale_after_s: float = 60.0, weight_total: int | None = None,
                 max_clock_skew_s: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
        self.target = target
        self.edge = edge
        self.listener = listener
        self.store = store
        self.audit = audit
        self.mode = mode
        self.max_step = max_step
        self.stale_after_s = stale_after_s
        self.max_clock_skew_s = max_clock_skew_s
        self.weight_total = weight_total or target.max_weight
        self.clock = clock
        # the history's entries applied with an epoch beyond this bound order nothing (the store's readers: the
        # service, the CLI); a store given its own bound keeps it
        if store.max_epoch_ahead_s is None:
            store.max_epoch_ahead_s = max_clock_skew_s
        # a controller re-sends its version every tick: audit one noop per (epoch, version)
        self._noop_audited: tuple[int, int] | None = None

    # -- reading -------------------------------------------------------------------------------
    def read(self) -> dict[str, int]:
        return self.target.read()

    def epoch_ahead_s(self, decision: EdgeWeights) -> float:
        """How far ``decision``'s epoch (its controller's start time, ms) is ahead of this host's clock."""
        return decision.epoch / 1000.0 - self.clock()

    def refuse_epoch_ahead(self, decision: EdgeWeights) -> ApplyResult | None:
        """``refused`` (audited, counted) when the epoch is more than ``max_clock_skew_s`` ahead; None otherwise.
        Wall clock on purpose, as for computed_at: the epoch is a date written by the controller's host."""
        ahead = self.epoch_ahead_s(decision)
        if ahead <= self.max_clock_skew_s:
            return None
        return self._done(decision, ApplyResult(
            "refused", decision.version, f"epoch {decision.epoch} (version {decision.version}) is a controller start "
                                         f"time {ahead:.1f}s in the future (> max_clock_skew_s "
                                         f"{self.max_clock_skew_s}): a controller clock is wrong or the record is no "
                                         "controller's; never made the version in force (it would outrank every "
                                         "real decision); holding the last good weights"))

    # -- applying a decision -------------------------------------------------------------------
    def apply(self, decision: EdgeWeights, manual: bool = False) -> ApplyResult:
        """Apply one decision; ``manual`` (an operator's ``opsloop weights apply``) skips the version
        checks and does not raise the version high-water mark, so the controller's next version applies."""
        now = self.clock()
        shares = dict(decision.weights)
        if (decision.listener, decision.edge) != (self.listener, self.edge):
            return self._done(decision, ApplyResult(
                "refused", decision.version, f"decision for {decision.listener}/{decision.edge} sent to "
                                             f"{self.listener}/{self.edge}"))
        if not (0 <= decision.version <= MAX_VERSION and 0 <= decision.epoch <= LAST_EPOCH):
            # a decoded record is within them (refused at decode); one built without validation (a controller
            # bug, as for the shares below) is not, and its entry would be damage to the store: never written
            return self._done(decision, ApplyResult(
                "refused", None, f"version {decision.version} (epoch {decision.epoch}) beyond what a decision "
                                 f"carries (versions 0..{MAX_VERSION}, epochs 0..{LAST_EPOCH}: ms up to the year "
                                 "9999); holding the last good weights"))
        if not manual:   # a manual apply takes the stamp in force (cli.py) and does not order decisions
            ahead = self.refuse_epoch_ahead(decision)
            if ahead is not None:
                return ahead
        unknown = sorted(o for o, s in shares.items() if s > 0 and o not in self.target.origins)
        if unknown:
            return self._done(decision, ApplyResult(
                "refused", decision.version, f"origin(s) {unknown} not served by {self.target.describe()} "
                                             f"(configured: {self.target.origins})"))
        # origins the target serves but the decision does not name get share 0 (quiesced)
        shares = {o: float(shares.get(o, 0.0)) for o in self.target.origins}
        if sum(shares.values()) <= 0:
            return self._done(decision, ApplyResult(
                "refused", decision.version, "decision would set every server to weight 0; holding the last good "
                                             "weights"))
        try:   # a record built without validation (a controller bug): NaN, negative, huge, not summing to 1
            check_shares(decision.weights)
        except ValueError as e:
            return self._done(decision, ApplyResult(
                "refused", decision.version, f"decision is no share distribution ({e}); holding the last good "
                                             "weights"))
        # Wall clock on purpose: computed_at is a date written by the controller's host (event time);
        # the service's own timers (freshness, back-off) are monotonic (service.py).
        age = now - decision.computed_at
        if -age > self.max_clock_skew_s:
            return self._done(decision, ApplyResult(
                "refused", decision.version, f"computed_at is {-age:.1f}s in the future (> max_clock_skew_s "
                                             f"{self.max_clock_skew_s}): a controller clock is wrong; holding the "
                                             "last good weights"))
        if age > self.stale_after_s:
            superseded = self._superseded(decision) if self.mode == "live" and not manual else None
            if superseded is not None:
                # a replayed copy older than what is applied says nothing about the controller now: not
                # a reason to fail static (a restart's backlog read over several polls opened and
                # cleared an edge.fail_static finding)
                return superseded
            return self._done(decision, ApplyResult(
                "held", decision.version, f"decision computed {age:.1f}s ago > stale_after_s {self.stale_after_s}: "
                                          "holding the last good weights (fail static)", stale=True))
        if self.mode == "live":
            try:   # a write a kill cut off: audited (and recorded) with its real before/after first
                self._resolve_intent()
            except StoreError as e:
                return self._store_failed(decision, e)
            except ActuatorError as e:
                return self._failed(decision, e, None)
        if self.mode == "live" and not manual:
            try:
                high = self.store.high_stamp()
                last = self.store.last()
            except StoreError as e:
                return self._store_failed(decision, e)
            if high is not None and decision.stamp < high:
                return self._stale_version(decision, high)
            if high is not None and decision.stamp == high and last is not None \
                    and (last.complete or last.action != "apply"):
                return self._done(decision, ApplyResult(
                    "noop", decision.version, f"version {decision.version} already applied", after=last.weights))
        try:
            before = self.target.read()
        except ActuatorError as e:
            if self.mode != "dry-run":
                return self._failed(decision, e, None)
            before = None
        stored = self._stored() if before else None
        try:
            down = self._down(stored) if before else set()
        except ActuatorError as e:
            # unknown health: "nothing DOWN" could move every share onto DOWN servers or revive a quiesced real
            if self.mode != "dry-run":
                return self._failed(decision, e, before)
            down = set()
        quiesced = self._quiesced(down)
        # Mirror HAProxy, where a DOWN server keeps its weight: step from the weight a quiesced real had
        # before its health checker zeroed it, so its share can be released (or held) like a DOWN one.
        base = {**before, **{o: int((stored or {}).get(o, 0)) for o in quiesced}} if before else None
        # servers the target leaves alone (HAProxy: absent, weighted by its agent) keep their live weight; like a
        # quiesced real they step from their stored weight (from the agent's, the step never reached the decision)
        alone = self._left_alone() if before else {}
        if alone and base:
            base = {**base, **self._intended(alone)}
        live_shares = to_shares(base) if base else {}
        if down and math.fsum(v for o, v in shares.items() if o not in down) <= 0:
            return self._done(decision, ApplyResult(
                "refused", decision.version, f"decision gives every share to origin(s) the load balancer reports "
                                             f"DOWN {sorted(down)}; holding the last good weights", before=before))
        releasable = {o for o in down if shares.get(o, 0.0) <= 0.0}
        stepped = bound_step(live_shares, shares, self.max_step, releasable) if before else dict(shares)
        complete = reaches(stepped, shares, tol=1e-6)
        try:
            ints = to_integer_weights(stepped, self.weight_total)
        except MappingError as e:
            return self._done(decision, ApplyResult("refused", decision.version, str(e), before=before))
        # a quiesced real stays at 0 whatever the decision gives it (its share is stored and comes back
        # by reconcile once the health checker restores it), as HAProxy keeps a DOWN server out of rotation
        writes = _hold_live(self._hold_quiesced(ints, quiesced), before, alone)
        if _serving(writes, down) <= 0:
            return self._done(decision, ApplyResult(
                "refused", decision.version, "decision would set every server that is not DOWN to weight 0; "
                                             "holding the last good weights", before=before, after=ints))
        note = "" if complete else f"; step bounded by max_step {self.max_step} (more steps to the decision)"
        released = f"; released DOWN origin(s) {sorted(releasable)}" if releasable and before else ""
        held = sorted(o for o in quiesced if ints.get(o, 0) > 0)
        if held:
            released += f"; held quiesced origin(s) {held} at 0 until the health checker restores them"
        released += _left_alone_note(alone)
        if self.mode == "dry-run":
            return self._done(decision, ApplyResult("dry_run", decision.version, "would set weights" + note + released,
                                                    before=before, after=writes, shares=stepped, complete=complete))
        if self.mode == "shadow":
            diff = share_difference(live_shares, shares)
            metrics.SHADOW_DIFF.labels(self.edge, self.listener).set(diff)
            return self._done(decision, ApplyResult("shadow", decision.version,
                                                    f"would move {diff:.3f} of the traffic" + note + released,
                                                    before=before, after=writes, shares=stepped, complete=complete))
        assert before is not None
        # the stored weights are the intended ones (a held quiesced real keeps its weight here): that is
        # how the next read tells it is still quiesced, and what reconcile puts back once it is restored
        entry = Entry(version=decision.version, epoch=decision.epoch, weights=ints, shares=stepped,
                      decision=shares, complete=complete, computed_at=decision.computed_at,
                      action="manual" if manual else "apply", reason=(decision.reason + note + released)[:500])
        if writes != before:
            try:
                self._note_write(writes, quiesced, stored)
                # unrecorded, a kill after the write would leave a change the trail never shows
                self.store.write_intent(Intent("edge.weights.apply", decision.version, before, writes, entry,
                                               time.time()))
            except StoreError as e:   # unnoted, a 0 this write leaves could pass for a quiesce for good
                return self._store_failed(decision, e, before=before)
            try:
                self._write(writes, before, down)
            except ActuatorError as e:
                return self._cleared(self._failed(decision, e, before, writes))
        result = self._verify(decision, before, writes, stepped, complete, ignore=set(alone))
        if result is not None:
            return self._cleared(result)
        try:
            self.store.append(entry)
        except StoreError as e:  # the weights are live; without a record the next decision cannot be ordered
            # the intent stays: the next action records the entry once the history takes it
            return self._store_failed(decision, e, before=before, after=writes)
        self._recorded()
        self._publish_weights(_without(writes, alone), decision.version)
        why = decision.reason or "decision"
        if writes == before:
            why += "; weights already live, nothing written"
        return self._cleared(self._done(decision, ApplyResult("applied", decision.version, why + note + released,
                                                              before=before, after=writes, shares=stepped,
                                                              complete=complete)))

    # -- write-ahead intent --------------------------------------------------------------------
    def _cleared(self, res: ApplyResult) -> ApplyResult:
        """``res`` is audited: the intent of its write has nothing left to say (a failure to remove it is
        logged; the restart then audits that write once more, harmless)."""
        try:
            self.store.clear_intent()
        except StoreError as e:
            metrics.ERRORS.labels(self.edge, "store").inc()
            log.warning("write_intent_not_cleared", edge=self.edge, listener=self.listener, error=str(e)[:300])
        return res

    def _resolve_intent(self) -> None:
        """A write a previous run began and did not see through (killed between the write and its record):
        audited with its real before/after -- ``applied`` and its entry appended when the weights it changed are
        live, ``failed`` when not -- then forgotten. ActuatorError (LB unreadable) or StoreError: left for the
        next call."""
        intent = self.store.intent()
        if intent is None:
            return
        live = self.target.read()
        changed = {o: w for o, w in intent.after.items() if intent.before.get(o) != w}
        landed = all(live.get(o) == w for o, w in changed.items())
        what = f"{intent.action} of version {intent.version}"
        if intent.entry is not None:
            what += f" (epoch {intent.entry.epoch})"
        if landed:
            entry = intent.entry
            if entry is not None and not self._recorded_since(intent):
                self.store.append(entry)
            self._recorded()
            log.warning("write_intent_recovered", edge=self.edge, listener=self.listener, action=intent.action,
                        version=intent.version, before=intent.before, after=intent.after)
            res = ApplyResult("applied", intent.version, f"recovered after a restart: the {what} wrote these weights "
                                                         "and the actuator stopped before recording it; recorded now",
                              before=intent.before, after=intent.after,
                              shares=entry.shares if entry is not None else {})
        else:
            metrics.ERRORS.labels(self.edge, "interrupted").inc()
            res = ApplyResult("failed", intent.version, f"interrupted: the actuator stopped during the {what}; live "
                                                        f"weights {live} are not the {intent.after} it wrote",
                              before=intent.before, after=live, error="write interrupted by a stop")
        self._cleared(self._done(None, res, version=intent.version, action=intent.action))

    def _recorded_since(self, intent: Intent) -> bool:
        """The history already holds the intent's entry (the kill came after the append, before the audit)."""
        entry = intent.entry
        last = self.store.last()
        return entry is not None and last is not None and last.stamp == entry.stamp \
            and last.action == entry.action and last.weights == entry.weights and last.applied_at >= entry.applied_at

    def _superseded(self, decision: EdgeWeights) -> ApplyResult | None:
        """``stale_version`` when a newer version than ``decision`` is applied; None otherwise or unreadable."""
        try:
            high = self.store.high_stamp()
        except StoreError:
            return None
        if high is None or decision.stamp >= high:
            return None
        return self._stale_version(decision, high)

    def _stale_version(self, decision: EdgeWeights, high: Stamp) -> ApplyResult:
        return self._done(decision, ApplyResult(
            "stale_version", decision.version, f"version {decision.version} (epoch {decision.epoch}) is older "
                                               f"than the applied version {high[1]} (epoch {high[0]})"))

    def _verify(self, decision: EdgeWeights | None, before: dict[str, int] | None, ints: dict[str, int],
                shares: dict[str, float], complete: bool, version: int | None = None,
                ignore: set[str] | None = None) -> ApplyResult | None:
        """Read back what was written; a ``mismatch`` (or unreadable) result, or None when it matches.
        ``ignore``: origins left alone (not written; an agent may move theirs any time)."""
        version = decision.version if decision is not None else version
        try:
            live = self.target.read()
        except ActuatorError as e:
            return self._failed(decision, e, before, ints, version=version)
        if _without(live, ignore or {}) != _without(ints, ignore or {}):
            metrics.ERRORS.labels(self.edge, "mismatch").inc()
            res = ApplyResult("mismatch", version, f"read back {live} after writing {ints}", before=before,
                              after=live, shares=shares, complete=complete, error="read-back mismatch")
            return self._done(decision, res, version=version)
        return None

    def _down(self, stored: dict[str, int] | None = None) -> set[str]:
        """The target's DOWN origins; ActuatorError when its health view cannot be read (not "none DOWN")."""
        # only a quiescing target needs the stored weights (and older targets take no argument)
        if _quiesces(self.target):
            return self.target.down(self._not_ours(stored))
        return self.target.down()

    def _not_ours(self, stored: dict[str, int] | None) -> dict[str, int] | None:
        """``stored`` without the origins a write of ours not yet read back and recorded may have set to 0:
        a live 0 there may be ours, and only a 0 nothing of ours can have set is a health checker's quiesce
        (else every later decision feeding that real is refused or held at 0 for good). Unreadable: none."""
        if not stored:
            return stored
        zeroed = self.store.unverified_zeroed()
        if zeroed is None:
            return {}
        return {o: w for o, w in stored.items() if o not in zeroed}

    def _left_alone(self) -> dict[str, str]:
        """Origins the target does not write, as of its last health read (``down``): origin -> why."""
        return dict(self.target.left_alone())

    def _intended(self, origins: dict[str, str]) -> dict[str, int]:
        """The stored (intended) weights of ``origins``; none when nothing is stored or unreadable."""
        try:
            last = self.store.last()
        except StoreError:
            return {}
        return {o: int(last.weights[o]) for o in origins if o in last.weights} if last is not None else {}

    def _note_write(self, writes: dict[str, int], quiesced: set[str], stored: dict[str, int] | None) -> None:
        """Write-ahead (quiescing target): note the origins this write sets to 0 over a stored weight above 0,
        except those held at the health checker's 0, before writing. StoreError: do not write."""
        if not _quiesces(self.target) or not stored:
            return
        zeroed = {o for o, w in writes.items() if w == 0 and o not in quiesced and stored.get(o, 0) > 0}
        if zeroed:
            self.store.note_unverified(zeroed, writes)

    def _recorded(self) -> None:
        """A write read back equal and its weights are the history's (or the history's put back): what an
        unverified write may have left is moot. Not cleared: some 0s stay counted as ours until the next."""
        if not _quiesces(self.target):
            return
        try:
            self.store.clear_unverified()
        except StoreError as e:
            metrics.ERRORS.labels(self.edge, "store").inc()
            log.warning("unverified_writes_not_cleared", edge=self.edge, listener=self.listener, error=str(e)[:300])

    def _stored(self) -> dict[str, int] | None:
        """The weights last applied, for a quiescing target's DOWN test; None if none or unreadable."""
        if not _quiesces(self.target):
            return None
        try:
            last = self.store.last()
        except StoreError:
            return None
        return {o: int(w) for o, w in last.weights.items()} if last is not None else None

    def _quiesced(self, down: set[str]) -> set[str]:
        """DOWN origins that must be held at weight 0 (a weight written to them would revive them)."""
        return set(down) if _quiesces(self.target) else set()

    @staticmethod
    def _hold_quiesced(weights: dict[str, int], quiesced: set[str]) -> dict[str, int]:
        return {o: (0 if o in quiesced else w) for o, w in weights.items()}

    def _write(self, weights: dict[str, int], before: dict[str, int], down: set[str]) -> None:
        """``target.write``; when it fails, read back, and if nothing that is not DOWN has weight left
        while something had before, put the pre-write weights back (best effort). The error (audited
        as ``failed``) says what was found and done: a failed apply must not leave the edge all-zero."""
        try:
            self.target.write(weights)
        except ActuatorError as e:
            raise ActuatorError(f"{e}{self._guard_all_zero(before, down)}", e.kind) from None

    def _guard_all_zero(self, before: dict[str, int], down: set[str]) -> str:
        try:
            live = self.target.read()
        except ActuatorError as e:
            return f"; read-back after the failure failed too: {str(e)[:200]}"
        if _serving(live, down) > 0 or _serving(before, down) <= 0:
            return ""
        try:
            self.target.write(before)
        except ActuatorError as e:
            return (f"; read-back {live} serves nothing; re-applying the previous weights {before} FAILED: "
                    f"{str(e)[:200]}")
        log.warning("weights_all_zero_restored", edge=self.edge, listener=self.listener, live=live, restored=before)
        return f"; read-back {live} served nothing: previous weights {before} re-applied"

    def _failed(self, decision: EdgeWeights | None, error: ActuatorError, before: dict[str, int] | None,
                after: dict[str, int] | None = None, version: int | None = None) -> ApplyResult:
        metrics.ERRORS.labels(self.edge, error.kind).inc()
        version = decision.version if decision is not None else version
        return self._done(decision, ApplyResult("failed", version, f"{error.kind}: {error}", before=before,
                                                after=after, error=str(error)[:1000]), version=version)

    def _store_failed(self, decision: EdgeWeights | None, error: StoreError, before: dict[str, int] | None = None,
                      after: dict[str, int] | None = None) -> ApplyResult:
        """The history cannot be read or written: fail static (the service opens a finding)."""
        metrics.ERRORS.labels(self.edge, "store").inc()
        version = decision.version if decision is not None else None
        return self._done(decision, ApplyResult("held", version, f"weight history unusable, holding the live "
                                                                 f"weights (fail static): {error}", before=before,
                                                after=after, stale=True, error=str(error)[:1000]))

    def fail(self, decision: EdgeWeights | None, reason: str, error: str | None = None,
             action: str = "edge.weights.apply") -> ApplyResult:
        """Audit and count ``decision`` as ``failed`` for what the service found outside :meth:`apply`
        (an internal error that broke it off, or giving the decision up after its attempts); without a
        decision, an internal error that broke off ``action`` (a reconcile) or the service's tick."""
        version = decision.version if decision is not None else None
        return self._done(decision, ApplyResult("failed", version, reason, error=(error or reason)[:1000]),
                          action=action)

    def _publish_weights(self, ints: dict[str, int], version: int) -> None:
        metrics.set_family(metrics.WEIGHT, (self.edge, self.listener), ints)
        metrics.VERSION.labels(self.edge, self.listener).set(version)

    # -- drift ----------------------------------------------------------------------------------
    def reconcile(self) -> ApplyResult | None:
        """Put the last stored weights back when the LB drifted (HAProxy restarted with its config
        weights, a hand-made ``set weight``). None when nothing is stored, the LB matches, or the mode
        is not live; an unreachable LB only counts an error (the next apply or reconcile retries)."""
        try:
            last = self.store.last()
        except StoreError as e:
            metrics.ERRORS.labels(self.edge, "store").inc()
            log.warning("reconcile_skipped", edge=self.edge, listener=self.listener, error=str(e)[:300])
            return None
        if last is None or self.mode != "live":
            return None
        try:
            self._resolve_intent()
            last = self.store.last() or last
        except (StoreError, ActuatorError) as e:
            metrics.ERRORS.labels(self.edge, e.kind if isinstance(e, ActuatorError) else "store").inc()
            log.warning("reconcile_skipped", edge=self.edge, listener=self.listener, error=str(e)[:300])
            return None
        want = {o: int(last.weights.get(o, 0)) for o in self.target.origins}
        try:
            live = self.target.read()
        except ActuatorError as e:
            metrics.ERRORS.labels(self.edge, e.kind).inc()
            return None
        try:
            down = self._down(want)
        except ActuatorError as e:  # without the health view a quiesced real would look like drift
            metrics.ERRORS.labels(self.edge, e.kind).inc()
            return None
        # a real its health checker quiesced (live 0, stored > 0) is no drift: it stays at 0 until restored
        quiesced = self._quiesced(down)
        alone = self._left_alone()   # absent or agent-weighted: their live weight is no drift
        writes = _hold_live(self._hold_quiesced(want, quiesced), live, alone)
        if live == writes or _serving(writes, down) <= 0:
            return None
        try:
            self._note_write(writes, quiesced, want)
            self.store.write_intent(Intent("edge.weights.reconcile", last.version, live, writes, None, time.time()))
        except StoreError as e:
            metrics.ERRORS.labels(self.edge, "store").inc()
            log.warning("reconcile_skipped", edge=self.edge, listener=self.listener, error=str(e)[:300])
            return None
        try:
            self._write(writes, live, down)
        except ActuatorError as e:
            return self._cleared(self._failed(None, e, live, writes, version=last.version))
        bad = self._verify(None, live, writes, last.shares, True, version=last.version, ignore=set(alone))
        if bad is not None:
            return self._cleared(bad)
        self._recorded()
        self._publish_weights(_without(writes, alone), last.version)
        held = f"; quiesced origin(s) {sorted(quiesced)} left at 0" if quiesced else ""
        held += _left_alone_note(alone)
        return self._cleared(self._done(None, ApplyResult("applied", last.version, f"drift: live weights {live} "
                                                                                   "differ from the stored version "
                                                                                   f"{last.version}; re-applied" + held,
                                                          before=live, after=writes, shares=last.shares),
                                        action="edge.weights.reconcile"))

    # -- hold / rollback -----------------------------------------------------------------------
    def hold(self, reason: str) -> ApplyResult:
        """Fail static without a decision to blame (none arrived for stale_after_s): audited once per call."""
        try:
            last = self.store.last()
        except StoreError:
            last = None
        return self._done(None, ApplyResult("held", last.version if last else None, reason,
                                            after=last.weights if last else None, stale=True))

    def rollback(self, to_version: int | None = None, reason: str = "") -> ApplyResult:
        """Re-apply the previous (or the given) version's weights from the store, audited."""
        if self.mode == "live":
            try:   # a write a kill cut off first: the rollback's "previous" must be what was really live
                self._resolve_intent()
            except ActuatorError as e:
                return self._failed(None, e, None, version=to_version)
        history = self.store.history()
        if not history:
            return self._done(None, ApplyResult("refused", to_version, "no applied weights in the history"),
                              action="edge.weights.rollback")
        if to_version is None:
            # by (epoch, version): a controller restarted in a new epoch may count its versions from 1 again
            current = history[-1].stamp
            earlier = [e for e in history if e.stamp < current]
            if not earlier:
                return self._done(None, ApplyResult("refused", None, f"no version older than {current[1]} "
                                                                     f"(epoch {current[0]}) in the history"),
                                  action="edge.weights.rollback")
            entry = earlier[-1]
        else:
            found = [e for e in history if e.version == to_version]
            if not found:
                known = sorted({e.version for e in history})
                return self._done(None, ApplyResult("refused", to_version, f"version {to_version} not in the "
                                                                           f"history (known: {known})"),
                                  action="edge.weights.rollback")
            entry = found[-1]
        ints = {o: int(entry.weights.get(o, 0)) for o in self.target.origins}
        stored = {o: int(w) for o, w in history[-1].weights.items()}
        try:
            down = self._down(stored)
        except ActuatorError as e:
            return self._failed(None, e, None, version=entry.version)
        if _serving(ints, down) <= 0:
            return self._done(None, ApplyResult("refused", entry.version, "version would zero every server that "
                                                                          "is not DOWN"),
                              action="edge.weights.rollback")
        quiesced = self._quiesced(down)
        writes = self._hold_quiesced(ints, quiesced)  # a rollback does not revive a quiesced real either
        why = reason or f"operator rollback to version {entry.version}"
        if quiesced:
            why += f"; quiesced origin(s) {sorted(quiesced)} held at 0"
        if self.mode != "live":
            res = ApplyResult("dry_run" if self.mode == "dry-run" else "shadow", entry.version, why, after=writes)
            return self._done(None, res, action="edge.weights.rollback")
        try:
            before = self.target.read()
        except ActuatorError as e:
            return self._failed(None, e, None, writes, version=entry.version)
        alone = self._left_alone()
        writes = _hold_live(writes, before, alone)
        why += _left_alone_note(alone)
        back = Entry(version=entry.version, epoch=entry.epoch, weights=ints, shares=entry.shares,
                     decision=entry.decision, complete=True, action="rollback", reason=why[:500])
        if before != writes:
            self._note_write(writes, quiesced, stored)   # StoreError: nothing written (as an append failing)
            self.store.write_intent(Intent("edge.weights.rollback", entry.version, before, writes, back, time.time()))
            try:
                self._write(writes, before, down)
            except ActuatorError as e:
                return self._cleared(self._failed(None, e, before, writes, version=entry.version))
        bad = self._verify(None, before, writes, entry.shares, True, version=entry.version, ignore=set(alone))
        if bad is not None:
            return self._cleared(bad)
        self.store.append(back)
        self._recorded()
        self._publish_weights(_without(writes, alone), entry.version)
        return self._cleared(self._done(None, ApplyResult("rolled_back", entry.version, why, before=before,
                                                          after=writes, shares=entry.shares),
                                        action="edge.weights.rollback"))

    # -- audit, metrics, log -------------------------------------------------------------------
    def _done(self, decision: EdgeWeights | None, res: ApplyResult, version: int | None = None,
              action: str = "edge.weights.apply") -> ApplyResult:
        metrics.APPLIES.labels(self.edge, self.listener, res.result).inc()
        if res.result == "noop":
            stamp = decision.stamp if decision is not None else (-1, res.version or 0)
            if self._noop_audited == stamp:
                log.debug("weights_noop", edge=self.edge, listener=self.listener, version=res.version)
                return res  # counted; the trail already says this version was re-sent
            self._noop_audited = stamp
        reason = res.reason
        if decision is not None and decision.mode.value != "normal":
            reason = f"[decision mode {decision.mode.value}] {reason}"
        self.audit.record(actor=f"actuator.{self.target.kind}", action=action, target=self.target.describe(),
                          edge=self.edge, listener=self.listener, version=res.version,
                          before=res.before, after=res.after, reason=reason[:4000], mode=_MODES[self.mode],
                          result=res.result, error=res.error,
                          labels={"complete": str(res.complete).lower()})
        level = log.warning if res.result in ("failed", "mismatch", "refused", "held", "stale_version") else log.info
        level("weights_" + res.result, edge=self.edge, listener=self.listener, version=res.version,
              before=res.before, after=res.after, reason=reason[:500])
        return res


def _quiesces(target: Target) -> bool:
    return bool(getattr(target, "quiesces", False))  # targets written before the attribute do not


def _serving(weights: dict[str, int], down: set[str]) -> int:
    """Total weight on origins the load balancer does not report DOWN (what can carry traffic)."""
    return sum(w for o, w in weights.items() if o not in down)


def _hold_live(weights: dict[str, int], live: dict[str, int] | None, alone: dict[str, str]) -> dict[str, int]:
    """``weights`` with the origins left alone at their live weight (what the batch leaves them at)."""
    if not alone or not live:
        return weights
    return {o: (live.get(o, w) if o in alone else w) for o, w in weights.items()}


def _without(weights: dict[str, int], origins: set[str] | dict[str, str]) -> dict[str, int]:
    return {o: w for o, w in weights.items() if o not in origins}


def _left_alone_note(alone: dict[str, str]) -> str:
    return f"; left alone (not written): {alone}"[:400] if alone else ""
