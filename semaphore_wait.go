package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/queue"
	"github.com/fencelock/fencelock/internal/timing"
)

// A semaphore's waits: a waiting Acquire's place in fencelock.semaphore_waiters, and its
// wake-ups, which it subscribes to on its pool's notifier under its wait id
// (internal/notify), once its lessor listens.

// Acquire grants a permit for ttl, waiting in the semaphore's queue while none is free for it,
// until it is granted or ctx ends. ttl is as for [Semaphore.TryAcquire].
//
// The first refused attempt takes a place at the back of the queue, in the same statement; the
// wait refreshes its place every third of its liveness (the TTL bounded to [250 ms, 5 s]), and
// a waiter that dies leaves the queue when its place expires (a permit given to it meanwhile
// lapses by its TTL). A release gives the head its permit and a NOTIFY that carries the grant
// (or, when the head's own attempt is running at that instant, frees the permit for it and
// tells it to look again): the wait takes it at once, its trust window mapped onto the local clock through its last
// statement, as for a lease handed over by [Lessor.Acquire]. At the head, the wait also tries
// again when the next reclaim of lost permits is due. Not listening (behind a pooler such as
// PgBouncer in transaction mode), it polls with the lessor's [Backoff]. Its statements wait for
// no other grant attempt: one that cannot decide at once (another transaction is creating the
// semaphore's row, or counting its permits after a lower limit) changes nothing, not even the
// wait's place, and the wait looks again after the first pause of the lessor's Backoff (at
// most 20 ms).
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
	id := queue.NewWaitID()
	sw := &semWait{wake: make(chan struct{}, 1)}
	l.mu.Lock()
	l.otherWaits++ // keeps the lessor attached to its pool's notifier while this waits
	l.mu.Unlock()
	queued := false // counted as waiting (metrics)
	sent := false   // an attempt that may have put the wait in the queue was sent
	m := l.cfg.common.metrics
	defer func() {
		sw.sub.Close()
		l.mu.Lock()
		l.otherWaits--
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
	told := ""            // the channel the queue had from this wait before its last attempt
	for n := 0; ; n++ {
		l.mu.Lock()
		if l.listen != nil {
			sw.listenLocked(s, id)
		}
		channel := sw.sub.Channel()
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
			sw.listenLocked(s, id)
		}
		listening := sw.sub.Channel()
		l.mu.Unlock()
		if listening != channel {
			// The pool's listening connection came up (or went down) since the attempt: tell
			// the queue at once where to wake this wait.
			continue
		}
		d := timing.QueueWait(info.listening, info.ahead, info.remaining, live, l.cfg.backoff(n), l.cfg.backoff(0)/4)
		if info.ahead == 0 && n == 0 || info.ahead < 0 || n > 0 && channel != told {
			// Joined at the head: a release that ran while this attempt did saw no waiter and
			// freed its permit instead of giving it. Or (ahead -1) nothing was decided: a
			// release was giving this wait a permit as the attempt ran, maybe to a channel it
			// did not know yet, or another attempt was creating the semaphore's row or
			// counting its permits (for one transaction's time; this attempt did not wait for
			// it). Or this attempt told the queue a new channel (the lessor's listener came up,
			// or was replaced): a release or a leaving waiter that ran meanwhile, finding this
			// wait busy with the attempt, freed a permit for it and told the channel the queue
			// still had, or none, while the attempt's snapshot saw no free permit. Look again
			// soon.
			d = min(d, joinRecheck)
		}
		told = channel
		if info.ahead < 0 {
			d = min(d, l.cfg.backoff(0)) // the first retry's pause, not the n-th's
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
			sw.mu.Lock()
			h := sw.handed
			sw.handed = nil
			sw.mu.Unlock()
			if h == nil {
				continue // "try now": a permit freed that could not be given
			}
			// A release gave this wait a permit, and took its row out of the queue: claim it
			// without a statement. Refused only when its trust window has already ended (the
			// permit then goes on to the next waiter), and the wait joins the queue again.
			lease, err := s.claim(ctx, lt, h.Name, h.Handoff, last)
			if !errors.Is(err, errRefused) {
				return lease, err
			}
		}
	}
}

// semWait is a Semaphore.Acquire in the semaphore's queue: wake is signalled (cap 1) by a
// notification for its wait id, or a change of the notifier's readiness, and handed holds the
// permit a release gave it, if any (at most one: the release took the wait's row out of the
// queue).
type semWait struct {
	wake chan struct{}
	sub  *notify.Subscription // its wake-ups; nil until its lessor listens; only its Acquire uses it

	mu     sync.Mutex
	handed *queue.Wakeup
}

// listenLocked subscribes sw, the wait id of an Acquire of s, to its wake-ups, unless it is
// subscribed already. The lessor's mu must be held.
func (sw *semWait) listenLocked(s *Semaphore, id int64) {
	if sw.sub != nil {
		return
	}
	l := s.l
	poke := func() {
		select {
		case sw.wake <- struct{}{}:
		default:
		}
	}
	sw.sub = subscribe(l.pool, l.cfg.common.logger, notify.Wakeups, queue.Key(id), notify.Handler{
		Notify: func(payload string) {
			wk, err := queue.ParseWake(payload)
			if err != nil {
				l.cfg.common.logger.Error("fencelock: unreadable notification", "payload", payload, "error", err)
				return
			}
			if wk.Holder != l.cfg.holder || wk.WaitID != id {
				return
			}
			if wk.Token != 0 { // a permit given to it (the name is the permit's)
				sw.mu.Lock()
				sw.handed = &wk
				sw.mu.Unlock()
			}
			poke()
		},
		Ready: func(bool) { poke() },
	})
}
