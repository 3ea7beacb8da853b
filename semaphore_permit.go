package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/queue"
	"github.com/fencelock/fencelock/internal/timing"
)

// A semaphore's permits: one grant attempt (SemaphoreAcquire), the claim of a permit a
// release gave to a wait, and a permit's release (SemaphoreRelease, which gives it to the head
// of the queue). A permit is a Lease whose release branch (Lease.releaseVia) is releasePermit.

// TryAcquire grants a permit for ttl if one is free and nobody waits for one, in one
// statement. ttl is a time.Duration between [MinTTL] and [MaxTTL] on the database clock. The
// permit is a lease renewed by the lessor's heartbeat until released or lost.
//
// The statement waits for no other grant attempt's lock. When it cannot decide at once (another
// transaction is creating the semaphore's row, or is counting its permits after a lowered
// limit: see [Semaphore]), TryAcquire tries again after a pause (the first of the lessor's
// [Backoff], at most 20 ms), for at most a second after the first such answer.
//
// Errors: an error that is [ErrNotAcquired] for errors.Is and says why: the limit's permits are all held,
// or waiters are ahead in the queue, or the semaphore stayed busy for that second (nobody may
// hold anything), or a permit was granted but its reply came after the permit's trust window
// (the TTL is too short for the round trip; the permit was released at once); an
// [*ArgumentError] before any SQL; ctx's error (wrapped) when
// ctx ends during a pause; an error wrapping [ErrReadOnly] on a hot standby, or a token error
// as for [Lessor.TryAcquire]; otherwise the pgx error, wrapped. If ctx ends while the grant is
// in flight, any permit it may have granted is ended before TryAcquire returns.
func (s *Semaphore) TryAcquire(ctx context.Context, ttl time.Duration) (*Lease, error) {
	lt, err := s.l.cfg.times(ttl)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	lease, err := s.try(ctx, lt)
	err = notAcquired(err)
	m := s.l.cfg.common.metrics
	m.acquired(ctx, mSemaphoreTry, start, err)
	if errors.Is(err, ErrNotAcquired) {
		m.contention(mSemaphoreTry)
	}
	return lease, err
}

// semBusyFor bounds how long [Semaphore.TryAcquire] keeps trying while its attempts
// cannot decide at once: while another transaction creates the semaphore's row (for the
// length of one first acquire's transaction), or counts its permits after a lowered limit
// (one grant's transaction at a time). It is counted from the first busy answer, so that a
// slow first statement (a loaded machine) does not use it up.
const semBusyFor = time.Second

// try runs a try's attempts (no place in the queue) until one decides (granted, refused, or
// an error), or busy attempts have run for semBusyFor since the first of them. A busy attempt
// (ahead -1) changed nothing on the server. A refusal wraps ErrNotAcquired with its reason
// (issue 40: a try on a semaphore nobody held answered "held").
func (s *Semaphore) try(ctx context.Context, lt leaseTimes) (*Lease, error) {
	id := queue.NewWaitID()
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	var busySince time.Time
	for {
		lease, info, err := s.attempt(ctx, lt, id, false, "", 0, nil)
		if !errors.Is(err, errRefused) {
			return lease, err
		}
		switch {
		case info.late:
			return nil, semRefused(fmt.Sprintf("semaphore %q: a permit was granted, but its reply came after the permit's trust window (TTL %v): released at once", s.name, lt.TTL))
		case info.ahead > 0:
			return nil, semRefused(fmt.Sprintf("semaphore %q: %d waiter(s) ahead in its queue", s.name, info.ahead))
		case info.ahead == 0:
			return nil, semRefused(fmt.Sprintf("semaphore %q: all %d permits held", s.name, info.permits))
		case busySince.IsZero():
			busySince = time.Now()
		case time.Since(busySince) >= semBusyFor:
			return nil, semRefused(fmt.Sprintf("semaphore %q: busy for %v (another transaction was creating its row, or counting its permits after a lower limit), undecided", s.name, semBusyFor))
		}
		d := min(s.l.cfg.backoff(0), joinRecheck)
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire semaphore %q: %w", s.name, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// semRefused is a refused try's error: it says why, and is [ErrNotAcquired] for errors.Is.
type semRefused string

func (e semRefused) Error() string        { return "fencelock: not acquired: " + string(e) }
func (e semRefused) Is(target error) bool { return target == ErrNotAcquired }

// semStatement is when a wait's statement was sent (local clock) and the database clock
// during it: the pair that maps a permit given to the wait onto the local clock.
type semStatement struct{ sent, serverNow time.Time }

// attempt runs one SemaphoreAcquire: the permit (granted by it, outcome 1, or given to the
// wait by a release, outcome 3), errRefused with what the refusal tells the next attempt's
// timing, or another error. When last is not nil it records the statement's times there.
// Attempts of one lessor on one semaphore run side by side: the cleanup of one of unknown
// outcome ends only the permit granted or given to its own wait id (the permit row records
// it), never a sibling's.
func (s *Semaphore) attempt(ctx context.Context, lt leaseTimes, waitID int64, join bool, channel string, live time.Duration, last *semStatement) (*Lease, attemptInfo, error) {
	l := s.l
	var row db.SemaphoreAcquireRow
	sent, err := l.runGrant(ctx, fmt.Sprintf("acquire semaphore %q", s.name), func(conn *pgxpool.Conn) (err error) {
		row, err = l.q.SemaphoreAcquire(ctx, conn, db.SemaphoreAcquireParams{
			Sem: s.name, Holder: l.cfg.holder, WaitID: waitID, TtlUs: lt.TTL.Microseconds(),
			DefaultLimit: int32(s.limit), Queue: join, Channel: channel, LiveUs: live.Microseconds(),
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
	info := attemptInfo{listening: channel != "", ahead: row.Ahead, remaining: time.Duration(row.RemainingUs) * time.Microsecond, permits: int(row.PermitLimit)}
	switch row.Outcome {
	case outcomeGranted:
	case outcomeHanded:
		lease, err := s.claim(ctx, lt, row.Name, queue.Handoff{Token: row.Token, ExpiresAt: row.ExpiresAt}, st)
		return lease, info, err
	default:
		return nil, info, errRefused
	}
	lease := s.permit(newLease(l, row.Name, Token(row.Token), lt, sent, row.ExpiresAt))
	if !l.cfg.clock.Now().Before(lease.TrustedUntil()) {
		lease.end(ErrReleased) // the reply came after the trust window: useless to its holder
		l.releasePermitToken(ctx, s.name, row.Name, lease.token)
		info.late = true
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
func (s *Semaphore) claim(ctx context.Context, lt leaseTimes, name string, h queue.Handoff, st semStatement) (*Lease, error) {
	l := s.l
	now := l.cfg.clock.Now()
	grantedAt, ok := timing.HandedGrantSent(st.sent, st.serverNow, h.ExpiresAt, lt.TTL, now)
	if !ok {
		l.releasePermitToken(ctx, s.name, name, Token(h.Token))
		return nil, errRefused
	}
	lease := s.permit(newLease(l, name, Token(h.Token), lt, grantedAt, h.ExpiresAt))
	if !now.Before(lease.TrustedUntil()) {
		lease.end(ErrReleased)
		l.releasePermitToken(ctx, s.name, name, Token(h.Token))
		return nil, errRefused
	}
	s.install(lease)
	return lease, nil
}

// permit makes lease one of s's permits: its release runs releasePermit, which gives it to the
// head of s's queue, instead of LeaseRelease.
func (s *Semaphore) permit(lease *Lease) *Lease {
	l, name, token := s.l, lease.name, lease.token
	lease.releaseVia = func(ctx context.Context) (bool, error) { return l.releasePermit(ctx, s.name, name, token) }
	return lease
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
	if row.NotifyChannel != "" && !notify.Deliver(row.NotifyChannel, row.NotifyPayload) {
		// The hand-off has committed; tell its waiter now. A waiter of this process (its
		// pool's notifier listens on the channel: any pool of the process, not only this
		// lessor's) is told directly (notify.Deliver), without a NOTIFY (issue 31); one of
		// another process by NOTIFY, in a commit that waits for no flush (see
		// fencelock.semaphore_release). Should this fail, the waiter finds the permit at its
		// next refresh: logged, not an error of the release.
		if err := l.q.SemaphoreNotify(ctx, l.pool, db.SemaphoreNotifyParams{Channel: row.NotifyChannel, Payload: row.NotifyPayload}); err != nil {
			l.cfg.common.logger.Warn("fencelock: could not tell a waiter of the permit given to it; it finds it at its next refresh",
				"semaphore", sem, "lease", slot, "error", err)
		}
	}
	if row.Outcome >= 2 {
		queue.CountWakeup()
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
