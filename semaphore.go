package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// MaxSemaphoreLimit is the largest limit a [Semaphore] takes: a grant counts the semaphore's
// permit rows, so its cost grows with the limit (docs/PERFORMANCE.md).
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
// the faults: a grant happens only while fewer are (the semaphore's row is locked to count
// them; a permit in the middle of a renewal, or locked by a guarded transaction, counts as
// held; migrations/00008_semaphores.sql).
// A permit whose holder died, paused or lost its connection is reclaimed when its TTL ends: it
// then counts no more, and its renewal can no longer revive it. The limit is stored in the
// database (table fencelock.semaphores): the first acquire of a semaphore creates it with the
// limit given to NewSemaphore, and [Semaphore.SetLimit] changes it at run time for everyone.
// A lower limit ends no permit: nothing is granted until the count falls below it.
//
// Permit i of semaphore S is the lease named "S#i" (0 <= i < limit): fencelock.holders and
// `fencelock locks` show permits as leases of those names; `fencelock release --force` ends
// one. Do not take a lease of that form with [Lessor.Acquire]: it would not be counted.
//
// Waiters are served first come, first served: a waiting [Semaphore.Acquire] takes a place in
// the semaphore's queue (fencelock.semaphore_waiters), and is granted only while the free
// permits cover it and every live waiter ahead of it; a try never takes a permit someone waits
// for. A release wakes the first two waiters (NOTIFY on the lessor's listening connection:
// the head, and the next in case the head is leaving or its grant is in flight); a grant
// wakes the next waiter while permits are still free, and a waiter that gives up wakes the one
// after it. A permit lost by its TTL, or ended
// by `fencelock release --force`, wakes nobody: the head tries again just after the first held
// permit expires, and the others refresh their places every third of their liveness. Each
// Acquire has a place of its own, so one lessor may hold and wait for several permits of a
// semaphore at once.
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
	lease, _, err := s.attempt(ctx, lt, newWaitID(), false, "", 0)
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
// a waiter that dies leaves the queue when its place expires. Woken by a release (NOTIFY), the
// wait tries again at once; not listening (behind a pooler such as PgBouncer in transaction
// mode), it polls with the lessor's [Backoff], capped by the time until the first permit
// expires.
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
	live := queueLiveness(ttl)
	id := newWaitID()
	wake := make(chan struct{}, 1)
	l.mu.Lock()
	l.semWaits[id] = wake
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
			// now: runGrant waited). A granted wait's statement took its row out.
			cctx, cancel := detached(ctx, cleanupTimeout)
			defer cancel()
			if lerr := l.q.SemaphoreLeave(cctx, l.pool, db.SemaphoreLeaveParams{Sem: s.name, WaitID: id}); lerr != nil {
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
	for n := 0; ; n++ {
		l.mu.Lock()
		channel := l.listeningChannelLocked()
		l.mu.Unlock()
		sent = true
		lease, info, err := s.attempt(ctx, lt, id, true, channel, live)
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
		d := queueWait(info.listening, info.ahead, info.remaining, live, l.cfg.backoff(n), l.cfg.backoff(0)/4)
		if info.ahead == 0 && n == 0 {
			// Joined at the head: a release that ran while this attempt did saw no waiter and
			// woke nobody. Look again soon, once.
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
		case <-wake:
		}
	}
}

// attempt runs one SemaphoreAcquire: the permit, errRefused with what the refusal tells the
// next attempt's timing, or another error. Attempts of one lessor on one semaphore run side by
// side: the cleanup of one of unknown outcome ends only the permit granted to its own wait id
// (the permit row records it), never a sibling's.
func (s *Semaphore) attempt(ctx context.Context, lt leaseTimes, waitID int64, queue bool, channel string, live time.Duration) (*Lease, attemptInfo, error) {
	l := s.l
	var row db.SemaphoreAcquireRow
	sent, _, err := l.runGrant(ctx, fmt.Sprintf("acquire semaphore %q", s.name), func(conn *pgxpool.Conn) (err error) {
		row, err = l.q.SemaphoreAcquire(ctx, conn, db.SemaphoreAcquireParams{
			Sem: s.name, Holder: l.cfg.holder, WaitID: waitID, TtlUs: lt.ttl.Microseconds(),
			DefaultLimit: int32(s.limit), Queue: queue, Channel: channel, LiveUs: live.Microseconds(),
		})
		return err
	}, func(cctx context.Context) error { return s.releaseUnknown(cctx, waitID) })
	if err != nil {
		return nil, attemptInfo{}, err
	}
	info := attemptInfo{listening: channel != "", ahead: row.Ahead, remaining: time.Duration(row.RemainingUs) * time.Microsecond}
	if row.Outcome != outcomeGranted {
		return nil, info, errRefused
	}
	lease := newLease(l, row.Name, Token(row.Token), lt, sent, row.ExpiresAt)
	lease.sem = s.name
	if !l.cfg.clock.Now().Before(lease.TrustedUntil()) {
		lease.end(ErrReleased) // the reply came after the trust window: useless to its holder
		l.releasePermitToken(ctx, s.name, row.Name, lease.token)
		return nil, info, errRefused
	}
	l.mu.Lock()
	old := l.active[row.Name]
	l.mu.Unlock()
	if old != nil {
		// The database granted this permit anew, so this lessor's earlier grant of it has
		// ended there: expired (its trust window has ended too, though the trust watch may
		// not have fired yet), or ended early (a forced release).
		old.lost(errGoneOnServer)
	}
	l.add(lease)
	return lease, info, nil
}

// releaseUnknown ends the permit granted to the wait waitID, if any, and wakes a waiter for it:
// after a grant attempt of unknown outcome, which handed no permit to anyone.
func (s *Semaphore) releaseUnknown(ctx context.Context, waitID int64) error {
	l := s.l
	_, err := l.q.SemaphoreReleaseUnknown(ctx, l.pool, db.SemaphoreReleaseUnknownParams{Sem: s.name, Holder: l.cfg.holder, WaitID: waitID})
	return err
}

// releasePermit runs SemaphoreRelease for the permit (slot, this holder, token) of sem: it ends
// the permit and wakes the waiters it lets in. It reports whether the grant was current.
func (l *Lessor) releasePermit(ctx context.Context, sem, slot string, token Token) (bool, error) {
	outcome, err := l.q.SemaphoreRelease(ctx, l.pool, db.SemaphoreReleaseParams{Sem: sem, Slot: slot, Holder: l.cfg.holder, Token: int64(token)})
	if err != nil {
		return false, wrapPg(fmt.Sprintf("release permit %q of semaphore %q", slot, sem), err)
	}
	if outcome == 2 {
		wakeups.Add(1)
	}
	return outcome != 0, nil
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
