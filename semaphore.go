package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/timing"
)

// MaxSemaphoreLimit is the largest limit a [Semaphore] takes. A grant and a release cost the
// same at every limit (free permits are kept in a set); what grows with the limit is the
// reclaim of permits lost by their TTL (one read of every permit row, at most once a second
// while permits are short) and [Semaphore.State] (docs/PERFORMANCE.md).
const MaxSemaphoreLimit = 10_000

// maxSemaphoreName leaves room in a lease name for a permit's "#<slot>" suffix.
const maxSemaphoreName = MaxNameLength - len("#9999")

// Semaphore is a named counting semaphore: at most its limit of holders at once, across every
// process that shares the database. Each holder holds a permit, which is a [*Lease]: a TTL on
// the database clock, renewed by the lessor's heartbeat, Done and Err when it is lost, a
// fencing token of its own (an int64 > 0 larger than every earlier token of its permit), and
// GuardTx, FenceTx and Release as for any lease.
//
// Never more than the limit of permits are unexpired at once on the database clock, whatever
// the faults: permit i is the lease row of slot i < limit, granted only while it is expired,
// so the limit holds by construction; after a lower limit, grants count the permits until
// those above it have ended (migrations/00012_semaphore_handoff.sql). A permit whose holder
// died, paused or lost its connection counts until its TTL ends, and its renewal can no
// longer revive it; it is reclaimed by the first grant attempt after it expired, at most about
// a second later while permits are short. The limit is stored in the database (table
// fencelock.semaphores): the first acquire of a semaphore creates it with the limit given to
// NewSemaphore, and [Semaphore.SetLimit] changes it at run time for everyone. A lower limit
// ends no permit: nothing is granted until the count falls below it.
//
// Permit i of semaphore S is the lease named "S#i" (0 <= i < limit): fencelock.holders and
// `fencelock locks` show permits as leases of those names; `fencelock release --force` ends
// one. Do not take a lease of that form with [Lessor.Acquire]: it would not be counted.
//
// Waiters are served first come, first served: a waiting [Semaphore.Acquire] takes a place in
// the semaphore's queue (fencelock.semaphore_waiters), and a try never takes a permit someone
// waits for. A release gives its permit to the head of the queue in its own statement (a new
// grant of that permit, with a fresh token) and tells that waiter alone, by NOTIFY on its
// lessor's listening connection; the waiter takes it without a statement of its own. A waiter
// whose place is being refreshed at that instant (every third of its liveness) is passed over
// for the next. No waiter's statement waits for another's: waiters run no statement between
// refreshes, and a grant never waits for another grant. A permit lost by its TTL, or ended by
// `fencelock release --force`, goes to the waiters when it is reclaimed: the head of the queue
// tries again when the next reclaim is due. Behind a pooler (PgBouncer in transaction mode)
// waiters poll with the lessor's [Backoff] and find the permit given to them. Each Acquire has
// a place of its own, so one lessor may hold and wait for several permits of a semaphore at
// once.
//
// A Semaphore is safe for concurrent use. The idea is Dijkstra's semaphore with the leased
// permits of Curator's InterProcessSemaphoreV2 and Redisson's RPermitExpirableSemaphore.
type Semaphore struct {
	l     *Lessor
	name  string
	limit int
}

// SemaphoreState is a semaphore's state on the database clock.
type SemaphoreState struct {
	Limit   int   // at most this many unexpired permits
	Held    int64 // permits unexpired now (above Limit only after a limit was lowered)
	Waiting int64 // live waiters in the queue
}

// NewSemaphore returns the semaphore name of lessor l, whose permits are leases of l. name is
// 1 to MaxNameLength-5 bytes of UTF-8 without NUL; limit is 1 to [MaxSemaphoreLimit], used
// when the first acquire creates the semaphore (the limit stored then wins over the one given
// here; [Semaphore.SetLimit] changes it). Errors: an [*ArgumentError]. No SQL runs.
func NewSemaphore(l *Lessor, name string, limit int) (*Semaphore, error) {
	if l == nil {
		return nil, argError("lessor", "must not be nil")
	}
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	if len(name) > maxSemaphoreName {
		return nil, argError("name", "is %d bytes long; a semaphore's limit is %d (room for a permit's suffix)", len(name), maxSemaphoreName)
	}
	if err := validateLimit(limit); err != nil {
		return nil, err
	}
	return &Semaphore{l: l, name: name, limit: limit}, nil
}

func validateLimit(limit int) error {
	if limit < 1 || limit > MaxSemaphoreLimit {
		return argError("limit", "is %d; it must be between 1 and %d", limit, MaxSemaphoreLimit)
	}
	return nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// TryAcquire grants a permit for ttl if one is free and nobody waits for one, in one
// statement. ttl is a time.Duration between [MinTTL] and [MaxTTL] on the database clock. The
// permit is a lease renewed by the lessor's heartbeat until released or lost.
//
// Errors: [ErrNotAcquired] when the limit is reached or anyone waits; an [*ArgumentError]
// before any SQL; an error wrapping [ErrReadOnly] on a hot standby, or a token error as for
// [Lessor.TryAcquire]; otherwise the pgx error, wrapped. If ctx ends while the grant is in
// flight, any permit it may have granted is ended before TryAcquire returns.
func (s *Semaphore) TryAcquire(ctx context.Context, ttl time.Duration) (*Lease, error) {
	lt, err := s.l.cfg.times(ttl)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	lease, _, err := s.attempt(ctx, lt, newWaitID(), false, "", 0, nil)
	err = notAcquired(err)
	m := s.l.cfg.common.metrics
	m.acquired(ctx, mSemaphoreTry, start, err)
	if err == ErrNotAcquired {
		m.contention(mSemaphoreTry)
	}
	return lease, err
}

// Acquire grants a permit for ttl, waiting in the semaphore's queue while none is free for it,
// until it is granted or ctx ends. ttl is as for [Semaphore.TryAcquire].
//
// The first refused attempt takes a place at the back of the queue, in the same statement; the
// wait refreshes its place every third of its liveness (the TTL bounded to [250 ms, 5 s]), and
// a waiter that dies leaves the queue when its place expires (a permit given to it meanwhile
// lapses by its TTL). A release gives the head its permit and a NOTIFY that carries the grant:
// the wait takes it at once, its trust window mapped onto the local clock through its last
// statement, as for a lease handed over by [Lessor.Acquire]. At the head, the wait also tries
// again when the next reclaim of lost permits is due. Not listening (behind a pooler such as
// PgBouncer in transaction mode), it polls with the lessor's [Backoff].
//
// Errors: ctx's error (wrapped) when ctx ends first, with nothing held and no place left in
// the queue (behind a pooler, where the end of an abandoned statement cannot be awaited, both
// are best effort: a late grant expires by its TTL, a late place by its liveness); otherwise
// as for [Semaphore.TryAcquire], except that [ErrNotAcquired] is never returned.
func (s *Semaphore) Acquire(ctx context.Context, ttl time.Duration) (lease *Lease, err error) {
	lt, err := s.l.cfg.times(ttl)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	defer func() { s.l.cfg.common.metrics.acquired(ctx, mSemaphoreAcquire, start, err) }()
	l := s.l
	live := timing.QueueLiveness(ttl)
	id := newWaitID()
	sw := &semWait{wake: make(chan struct{}, 1)}
	l.mu.Lock()
	l.semWaits[id] = sw
	l.mu.Unlock()
	queued := false // counted as waiting (metrics)
	sent := false   // an attempt that may have put the wait in the queue was sent
	m := l.cfg.common.metrics
	defer func() {
		l.mu.Lock()
		delete(l.semWaits, id)
		l.idleCheckLocked()
		l.mu.Unlock()
		if queued {
			m.dequeued()
		}
		if sent && err != nil {
			// Out of the queue before returning: a wait that gave up must not hold a place,
			// even one an attempt of unknown outcome may have taken (its backend has exited by
			// now: runGrant waited), and a permit a release gave it meanwhile goes on to the
			// next waiter. A granted wait's statement took its row out.
			cctx, cancel := detached(ctx, cleanupTimeout)
			defer cancel()
			if _, lerr := l.q.SemaphoreLeave(cctx, l.pool, db.SemaphoreLeaveParams{Sem: s.name, WaitID: id, Holder: l.cfg.holder}); lerr != nil {
				l.cfg.common.logger.Error("fencelock: could not leave a semaphore's queue; the place expires by itself",
					"semaphore", s.name, "holder", l.cfg.holder, "error", lerr)
			}
		}
	}()
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	var last semStatement // the wait's last statement, which maps a handed permit's expiry
	for n := 0; ; n++ {
		l.mu.Lock()
		channel := l.listeningChannelLocked()
		l.mu.Unlock()
		sent = true
		lease, info, err := s.attempt(ctx, lt, id, true, channel, live, &last)
		if !errors.Is(err, errRefused) {
			return lease, err
		}
		l.mu.Lock()
		if !queued {
			queued = true
			m.contention(mSemaphoreAcquire)
			m.queued()
			l.attachListenerLocked()
		}
		listening := l.listeningChannelLocked()
		l.mu.Unlock()
		if listening != channel {
			// The pool's listening connection came up (or went down) since the attempt: tell
			// the queue at once where to wake this wait.
			continue
		}
		d := timing.QueueWait(info.listening, info.ahead, info.remaining, live, l.cfg.backoff(n), l.cfg.backoff(0)/4)
		if info.ahead == 0 && n == 0 || info.ahead < 0 {
			// Joined at the head: a release that ran while this attempt did saw no waiter and
			// freed its permit instead of giving it. Or (ahead -1) a release was giving this
			// wait a permit as the attempt ran, maybe to a channel it did not know yet. Look
			// again soon.
			d = min(d, joinRecheck)
		}
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire semaphore %q: %w", s.name, context.Cause(ctx))
		case <-t.C:
		case <-sw.wake:
			l.mu.Lock()
			h := sw.handed
			sw.handed = nil
			l.mu.Unlock()
			if h == nil {
				continue // "try now": a permit freed that could not be given
			}
			// A release gave this wait a permit, and took its row out of the queue: claim it
			// without a statement. Refused only when its trust window has already ended (the
			// permit then goes on to the next waiter), and the wait joins the queue again.
			lease, err := s.claim(ctx, lt, h.name, h.handoff, last)
			if !errors.Is(err, errRefused) {
				return lease, err
			}
		}
	}
}

// semWait is a Semaphore.Acquire in the semaphore's queue: wake is signalled (cap 1) by a
// notification for its wait id, and handed holds the permit a release gave it, if any (at
// most one: the release took the wait's row out of the queue). Guarded by the lessor's mu.
type semWait struct {
	wake   chan struct{}
	handed *wakeup
}

// semStatement is when a wait's statement was sent (local clock) and the database clock
// during it: the pair that maps a permit given to the wait onto the local clock.
type semStatement struct{ sent, serverNow time.Time }

// attempt runs one SemaphoreAcquire: the permit (granted by it, outcome 1, or given to the
// wait by a release, outcome 3), errRefused with what the refusal tells the next attempt's
// timing, or another error. When last is not nil it records the statement's times there.
// Attempts of one lessor on one semaphore run side by side: the cleanup of one of unknown
// outcome ends only the permit granted or given to its own wait id (the permit row records
// it), never a sibling's.
func (s *Semaphore) attempt(ctx context.Context, lt leaseTimes, waitID int64, queue bool, channel string, live time.Duration, last *semStatement) (*Lease, attemptInfo, error) {
	l := s.l
	var row db.SemaphoreAcquireRow
	sent, err := l.runGrant(ctx, fmt.Sprintf("acquire semaphore %q", s.name), func(conn *pgxpool.Conn) (err error) {
		row, err = l.q.SemaphoreAcquire(ctx, conn, db.SemaphoreAcquireParams{
			Sem: s.name, Holder: l.cfg.holder, WaitID: waitID, TtlUs: lt.TTL.Microseconds(),
			DefaultLimit: int32(s.limit), Queue: queue, Channel: channel, LiveUs: live.Microseconds(),
		})
		return err
	}, func(cctx context.Context) error { return s.releaseUnknown(cctx, waitID) })
	if err != nil {
		return nil, attemptInfo{}, err
	}
	st := semStatement{sent: sent, serverNow: row.ServerNow}
	if last != nil {
		*last = st
	}
	info := attemptInfo{listening: channel != "", ahead: row.Ahead, remaining: time.Duration(row.RemainingUs) * time.Microsecond}
	switch row.Outcome {
	case outcomeGranted:
	case outcomeHanded:
		lease, err := s.claim(ctx, lt, row.Name, handoff{token: Token(row.Token), expiresAt: row.ExpiresAt}, st)
		return lease, info, err
	default:
		return nil, info, errRefused
	}
	lease := newLease(l, row.Name, Token(row.Token), lt, sent, row.ExpiresAt)
	lease.sem = s.name
	if !l.cfg.clock.Now().Before(lease.TrustedUntil()) {
		lease.end(ErrReleased) // the reply came after the trust window: useless to its holder
		l.releasePermitToken(ctx, s.name, row.Name, lease.token)
		return nil, info, errRefused
	}
	s.install(lease)
	return lease, info, nil
}

// claim makes a lease of the permit name that a release gave to a wait of this semaphore, with
// h's token and expiry, its trust window mapped onto the local clock through the wait's
// statement st (handedGrantSent), as for a lease handed over by [Lessor.Acquire]'s queue. A
// permit whose window has already ended, or that no statement can map, goes on to the next
// waiter (released), and the claim is refused.
func (s *Semaphore) claim(ctx context.Context, lt leaseTimes, name string, h handoff, st semStatement) (*Lease, error) {
	l := s.l
	now := l.cfg.clock.Now()
	grantedAt, ok := timing.HandedGrantSent(st.sent, st.serverNow, h.expiresAt, lt.TTL, now)
	if !ok {
		l.releasePermitToken(ctx, s.name, name, h.token)
		return nil, errRefused
	}
	lease := newLease(l, name, h.token, lt, grantedAt, h.expiresAt)
	lease.sem = s.name
	if !now.Before(lease.TrustedUntil()) {
		lease.end(ErrReleased)
		l.releasePermitToken(ctx, s.name, name, h.token)
		return nil, errRefused
	}
	s.install(lease)
	return lease, nil
}

// install adds a permit granted to this lessor to its held leases.
func (s *Semaphore) install(lease *Lease) {
	l := s.l
	l.mu.Lock()
	old := l.active[lease.name]
	l.mu.Unlock()
	if old != nil {
		// The database granted this permit anew, so this lessor's earlier grant of it has
		// ended there: expired (its trust window has ended too, though the trust watch may
		// not have fired yet), or ended early (a forced release).
		old.lost(errGoneOnServer)
	}
	l.add(lease)
}

// releaseUnknown ends the permit granted or given to the wait waitID, if any, and gives it to
// the next waiter: after a grant attempt of unknown outcome, which handed no permit to anyone.
func (s *Semaphore) releaseUnknown(ctx context.Context, waitID int64) error {
	l := s.l
	_, err := l.q.SemaphoreReleaseUnknown(ctx, l.pool, db.SemaphoreReleaseUnknownParams{Sem: s.name, Holder: l.cfg.holder, WaitID: waitID})
	return err
}

// releasePermit runs SemaphoreRelease for the permit (slot, this holder, token) of sem: it ends
// the permit and gives it to the head of the queue (or frees it). It reports whether the
// grant was current.
func (l *Lessor) releasePermit(ctx context.Context, sem, slot string, token Token) (bool, error) {
	row, err := l.q.SemaphoreRelease(ctx, l.pool, db.SemaphoreReleaseParams{Sem: sem, Slot: slot, Holder: l.cfg.holder, Token: int64(token)})
	if err != nil {
		return false, wrapPg(fmt.Sprintf("release permit %q of semaphore %q", slot, sem), err)
	}
	if row.NotifyChannel != "" {
		// The hand-off has committed; tell its waiter now, in a commit that waits for no
		// flush (see fencelock.semaphore_release). Should this fail, the waiter finds the
		// permit at its next refresh: logged, not an error of the release.
		if err := l.q.SemaphoreNotify(ctx, l.pool, db.SemaphoreNotifyParams{Channel: row.NotifyChannel, Payload: row.NotifyPayload}); err != nil {
			l.cfg.common.logger.Warn("fencelock: could not tell a waiter of the permit given to it; it finds it at its next refresh",
				"semaphore", sem, "lease", slot, "error", err)
		}
	}
	if row.Outcome >= 2 {
		wakeups.Add(1)
	}
	return row.Outcome != 0, nil
}

// releasePermitToken is releasePermit detached from ctx's cancellation, for a permit nobody
// will use; errors are logged.
func (l *Lessor) releasePermitToken(ctx context.Context, sem, slot string, token Token) {
	rctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	if _, err := l.releasePermit(rctx, sem, slot, token); err != nil {
		l.cfg.common.logger.Error("fencelock: could not end a permit nobody uses; it expires by its TTL",
			"semaphore", sem, "lease", slot, "token", int64(token), "holder", l.cfg.holder, "error", err)
	}
}

// SetLimit sets the semaphore's limit to limit (1 to [MaxSemaphoreLimit]) for every process,
// in one statement, and wakes the waiters a larger limit lets in. A lower limit ends no
// permit: nothing is granted until fewer than limit are held. It returns the previous limit (0
// when the semaphore had no row yet). Errors: an [*ArgumentError] before any SQL; otherwise the
// pgx error, wrapped.
func (s *Semaphore) SetLimit(ctx context.Context, limit int) (previous int, err error) {
	if err := validateLimit(limit); err != nil {
		return 0, err
	}
	prev, err := s.l.q.SemaphoreSetLimit(ctx, s.l.pool, db.SemaphoreSetLimitParams{Sem: s.name, PermitLimit: int32(limit)})
	if err != nil {
		return 0, wrapPg(fmt.Sprintf("set the limit of semaphore %q", s.name), err)
	}
	return int(prev), nil
}

// State reads the semaphore's limit, permits held and live waiters, in one statement. A
// semaphore nobody has acquired yet reports the limit given to NewSemaphore and nothing held.
// Errors: the pgx error, wrapped.
func (s *Semaphore) State(ctx context.Context) (SemaphoreState, error) {
	row, err := s.l.q.SemaphoreState(ctx, s.l.pool, s.name)
	if errors.Is(err, pgx.ErrNoRows) {
		return SemaphoreState{Limit: s.limit}, nil
	}
	if err != nil {
		return SemaphoreState{}, wrapPg(fmt.Sprintf("read semaphore %q", s.name), err)
	}
	return SemaphoreState{Limit: int(row.PermitLimit), Held: row.Held, Waiting: row.Waiting}, nil
}
