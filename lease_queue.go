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

// The queue of lease waiters, the client's side (the server's is migrations/00004 and
// sqlc/queries/queue.sql; the waits' bookkeeping is internal/queue). A waiting Acquire joins
// the name's queue with its first refused attempt and is served first come, first served: a
// release hands the lease to the head of the queue in its own statement and wakes only that
// waiter, through its pool's notifier (internal/notify, listener.go). While anyone waits, no
// attempt from outside the queue is granted (TryAcquire does not barge). A waiter refreshes
// its place every third of its liveness (queueLiveness); one that dies leaves the queue when
// its row expires, one that gives up deletes its row, and hands on a grant it was handed.

// Acquire grants the lease name for ttl to this lessor, waiting while someone else holds it,
// until it is granted or ctx ends. Arguments are as for [Lessor.TryAcquire].
//
// Waiters are served first come, first served. The first refused attempt takes a place at the
// back of the name's queue, in the same statement. The holder's release hands the lease to the
// head of the queue in its own statement (one commit, a fresh token) and wakes that waiter
// alone, by NOTIFY on the listening connection of its pool (a few hundred microseconds; figures
// in docs/PERFORMANCE.md). A holder that dies hands nothing over: the head tries again just
// after the grant expires on the database clock. While it waits, a waiter refreshes its place
// every third of its liveness, which is the TTL bounded to [250 ms, 5 s]. A waiter whose ctx
// ends leaves the queue before Acquire returns, and hands on a grant it was handed meanwhile. A
// waiter that dies or stops (kill -9, SIGSTOP) leaves the queue when its place expires, at most
// its liveness after its last refresh; a release in between hands the lease to it, and that
// grant lapses by its TTL. So a dead waiter delays the others by at most its liveness plus, if
// a release came in between, the TTL (measured: docs/RELIABILITY.md).
//
// Where LISTEN cannot work (behind a pooler such as PgBouncer in transaction mode, detected
// when the backend pid differs from the connection's; or while the listening connection is
// down: a connection that died silently, a half-open TCP flow, is found dead within 4 s of its
// last sign of life, by a probe the notifier sends after 2 s of quiet), waiters poll with the
// lessor's [Backoff], capped by the holder's remaining TTL; a
// release still hands the lease over, and the head finds it at its next poll. The order is the
// same.
//
// The trust window of a handed-over grant is mapped onto the local clock through the waiter's
// last statement (sent at s on the local clock, during which the database clock read S): it
// ends at s + (expiry - S) - safety margin, the same clock-rate assumption as every trust
// window.
//
// Errors: ctx's error (wrapped) when ctx ends first, with nothing left held and no place left
// in the queue; otherwise as for [Lessor.TryAcquire], except that [ErrNotAcquired] is never
// returned.
func (l *Lessor) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	lt, err := l.cfg.times(ttl)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	lease, err := l.acquireQueued(ctx, name, lt)
	l.cfg.common.metrics.acquired(ctx, mAcquire, start, err)
	return lease, err
}

// acquireQueued is Acquire's loop: attempts, in the name's queue from the first refusal on,
// until granted or ctx ends.
func (l *Lessor) acquireQueued(ctx context.Context, name string, lt leaseTimes) (lease *Lease, err error) {
	live := timing.QueueLiveness(lt.TTL)
	err = l.waitInQueue(ctx, "acquire lease", name, live, true, func(w *queue.Wait, _ func()) (a attemptInfo, err error) {
		lease, a, err = l.attempt(ctx, name, lt, w, live)
		return a, err
	})
	return lease, err
}

// attempt makes one attempt of the wait w of an Acquire: the lease, errRefused, or another
// error, and what a refusal tells the next attempt's timing. It first claims a grant a release
// handed over by NOTIFY; then it runs LeaseAcquire, which grants the lease (outcome 1), finds
// it handed to this wait before the statement (2) or while it ran (3), or refuses it, with the
// wait in the queue (4). live is the wait's liveness in the queue.
func (l *Lessor) attempt(ctx context.Context, name string, lt leaseTimes, w *queue.Wait, live time.Duration) (*Lease, attemptInfo, error) {
	exit, err := l.enterFree(ctx, name)
	if err != nil {
		return nil, attemptInfo{}, err
	}
	defer exit()
	l.mu.Lock()
	handed, sent, serverNow := w.TakeHanded(), w.Sent, w.ServerNow
	waitID, channel := w.ID, l.listen.Channel()
	l.mu.Unlock()
	if len(handed) > 0 { // at most one: a wait id is handed one grant
		lease, err := l.claim(ctx, name, lt, handed[0], sent, serverNow)
		l.noteClaim(w, lease)
		if !errors.Is(err, errRefused) {
			return lease, attemptInfo{}, err
		}
	}
	var row db.LeaseAcquireRow
	sent, err = l.grantStatement(ctx, name, func(conn *pgxpool.Conn) (err error) {
		row, err = l.q.LeaseAcquire(ctx, conn, db.LeaseAcquireParams{
			Name:    name,
			Holder:  l.cfg.holder,
			WaitID:  waitID,
			TtlUs:   lt.TTL.Microseconds(),
			Channel: channel,
			LiveUs:  live.Microseconds(),
		})
		return err
	})
	if err != nil {
		// The wait keeps its id, even after a statement of unknown outcome: the cleanup
		// (grantFailed) ended what the statement may have granted (outcome 1, which also took
		// the wait's row out of the queue) and spared any grant a release handed to the wait
		// (one outcomes 2 and 3 found, or one handed since), which the wait's next attempt (a
		// sibling's) then claims with that id, from the NOTIFY or from the row, or leaving the
		// queue hands on. Under a new id the next attempt would reset the row, leaving such a
		// grant held by nobody for its TTL, and lose the wait's place (outcome 4).
		return nil, attemptInfo{}, err
	}
	l.mu.Lock()
	w.Sent, w.ServerNow = sent, row.ServerNow
	if row.Outcome == outcomeMine || row.Outcome == outcomeHanded {
		w.RenewID() // its row is used up
	}
	l.mu.Unlock()
	info := attemptInfo{joined: row.Joined, listening: channel != "", ahead: row.Ahead, remaining: time.Duration(row.RemainingUs) * time.Microsecond}
	switch row.Outcome {
	case outcomeGranted:
		lease, err := l.granted(ctx, name, lt, Token(row.Token), sent, row.ExpiresAt)
		return lease, info, err
	case outcomeMine, outcomeHanded:
		lease, err := l.claim(ctx, name, lt, queue.Handoff{Token: row.Token, ExpiresAt: row.ExpiresAt}, sent, row.ServerNow)
		l.noteClaim(w, lease)
		return lease, info, err
	case outcomeQueued:
		return nil, info, errRefused
	}
	return nil, info, fmt.Errorf("acquire lease %q: unexpected outcome %d of the grant statement", name, row.Outcome)
}

// noteClaim records that an attempt of w claimed lease (nil: none), so that leaving the queue
// does not hand on a grant this lessor took (and may be releasing itself right now).
func (l *Lessor) noteClaim(w *queue.Wait, lease *Lease) {
	if lease == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	w.NoteClaim(int64(lease.token))
}

// claim makes a lease of a grant a release handed to a wait of this lessor, with h's token and
// expiry. The trust window is mapped onto the local clock through a statement sent at sent
// (local) during which the database clock read serverNow (handedGrantSent). A grant whose
// window has already ended, or that no statement can map, is handed on, and the claim
// refused (granted). The caller holds name's gate.
func (l *Lessor) claim(ctx context.Context, name string, lt leaseTimes, h queue.Handoff, sent, serverNow time.Time) (*Lease, error) {
	if l.holds(name) {
		return nil, fmt.Errorf("acquire lease %q: %w", name, ErrAlreadyHeld)
	}
	grantedAt, ok := timing.HandedGrantSent(sent, serverNow, h.ExpiresAt, lt.TTL, l.cfg.clock.Now())
	if !ok {
		l.releaseToken(ctx, name, Token(h.Token))
		return nil, errRefused
	}
	return l.granted(ctx, name, lt, Token(h.Token), grantedAt, h.ExpiresAt)
}

// joinWait registers a goroutine waiting for name and returns its wait.
func (l *Lessor) joinWait(name string) *queue.Wait {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.waits[name]
	if w == nil {
		w = queue.NewWait()
		l.waits[name] = w
		if l.listen != nil {
			l.listenWaitLocked(name, w)
		}
	}
	w.Refs++
	return w
}

// leaveWait unregisters a goroutine's wait. The last one out takes the wait's row out of the
// queue, unless it was granted a TTL lease (the grant's statement did, or the hand-off marked
// it), and hands on every grant handed to the wait that no Acquire claimed. It runs detached
// from ctx: a cancelled wait must not stay in the queue.
func (l *Lessor) leaveWait(ctx context.Context, name string, w *queue.Wait, granted bool) {
	cctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	// The name's gate first, then out of the lessor's waits: a new wait of this lessor on the
	// name (a new id) then makes its first statement only after this one has left the queue,
	// so the row this takes out (whatever its id) and the grants it hands on are this wait's.
	exit, gateErr := l.enter(cctx, name)
	if gateErr == nil {
		defer exit()
	}
	l.mu.Lock()
	w.Refs--
	if granted {
		w.Signal() // the lessor's other goroutines on name: ErrAlreadyHeld
	}
	if w.Refs > 0 {
		l.mu.Unlock()
		return
	}
	delete(l.waits, name)
	handed, claimed := w.Close()
	l.idleCheckLocked()
	l.mu.Unlock()
	if gateErr != nil {
		l.cfg.common.logger.Error("fencelock: could not leave a lease's queue; the place expires by itself",
			"lease", name, "holder", l.cfg.holder, "error", gateErr)
		return
	}
	if !granted {
		row, err := l.q.LeaseLeaveQueue(cctx, l.pool, db.LeaseLeaveQueueParams{Name: name, Holder: l.cfg.holder})
		switch {
		case err != nil:
			l.cfg.common.logger.Error("fencelock: could not leave a lease's queue; the place expires by itself",
				"lease", name, "holder", l.cfg.holder, "error", err)
		case row.GrantedToken != 0:
			handed = append(handed, row.GrantedToken)
		}
	}
	for _, token := range handed {
		if !claimed[token] {
			l.releaseUnclaimedLocked(cctx, name, Token(token))
		}
	}
}

// releaseUnclaimed ends the grant of name with token, handing it to the next waiter, unless
// this lessor holds it (an Acquire claimed it). It takes name's gate, so no claim runs
// meanwhile.
func (l *Lessor) releaseUnclaimed(ctx context.Context, name string, token Token) {
	exit, err := l.enter(ctx, name)
	if err != nil {
		l.cfg.common.logger.Error("fencelock: could not hand on a grant nobody waits for; it expires by its TTL",
			"lease", name, "token", int64(token), "holder", l.cfg.holder, "error", err)
		return
	}
	defer exit()
	l.releaseUnclaimedLocked(ctx, name, token)
}

// releaseUnclaimedLocked is releaseUnclaimed for a caller that holds name's gate.
func (l *Lessor) releaseUnclaimedLocked(ctx context.Context, name string, token Token) {
	l.mu.Lock()
	held, releasing := l.active[name], l.releasing[token] > 0
	l.mu.Unlock()
	if held != nil && held.token == token || releasing {
		return
	}
	l.releaseToken(ctx, name, token)
}

// waitInQueue calls attempt until it returns anything but errRefused, or ctx ends (then it
// returns ctx's cause, wrapped with what and name). The wait joins the name's queue with its
// first refused attempt; between attempts it sleeps queueWait, unless a release wakes it.
// granting: a successful attempt ends the wait's place itself (a TTL grant's statement
// deletes it, a hand-off marks it); otherwise (RunLocked) the place is left when the call ends.
// attempt's second argument ends the call's count as waiting (metrics.go), for an attempt
// that got what it waited for and goes on to use it (a RunLocked's fn); it is idempotent,
// and the wait ends it anyway when it returns.
func (l *Lessor) waitInQueue(ctx context.Context, what, name string, live time.Duration, granting bool, attempt func(w *queue.Wait, stopWaiting func()) (attemptInfo, error)) (err error) {
	w := l.joinWait(name)
	defer func() { l.leaveWait(ctx, name, w, granting && err == nil) }()
	m := l.cfg.common.metrics
	var counted bool // queued: counted as waiting; only this goroutine reads and writes it
	stopWaiting := func() {
		if counted {
			counted = false
			m.dequeued()
		}
	}
	defer stopWaiting()
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for n := 0; ; n++ {
		// The wake channel of before the attempt: a wake-up during the attempt's statement
		// ends the sleep after it at once.
		l.mu.Lock()
		wake := w.Wake()
		l.mu.Unlock()
		a, err := attempt(w, stopWaiting)
		if !errors.Is(err, errRefused) {
			return err
		}
		if n == 0 {
			mt := mRunLocked
			if granting {
				mt = mAcquire
			}
			m.contention(mt)
			m.queued()
			counted = true
		}
		l.mu.Lock()
		if n == 0 {
			l.attachListenerLocked()
		}
		var handed []queue.Handoff
		if !granting {
			// A RunLocked takes no TTL grant; one handed to its wait (an Acquire of the same
			// lessor on the name shared it and has left) is handed on.
			handed = w.TakeHanded()
		}
		pending := w.Pending()
		l.mu.Unlock()
		for _, h := range handed {
			l.releaseUnclaimed(ctx, name, Token(h.Token))
		}
		if pending {
			continue
		}
		d := timing.QueueWait(a.listening, a.ahead, a.remaining, live, l.cfg.backoff(n), l.cfg.backoff(0)/4)
		if a.joined && a.ahead == 0 {
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
			return fmt.Errorf("%s %q: %w", what, name, context.Cause(ctx))
		case <-t.C:
		case <-wake:
		}
	}
}

// attachListenerLocked attaches l to its pool's notifier, opening it when l is its first
// subscriber, and subscribes each of l's waits that does not listen yet. l.mu must be held.
func (l *Lessor) attachListenerLocked() {
	if l.listen == nil {
		l.listen = subscribe(l.pool, l.cfg.common.logger, notify.Wakeups, "", notify.Handler{})
	}
	for name, w := range l.waits {
		if !w.Listening() {
			l.listenWaitLocked(name, w)
		}
	}
}

// listenWaitLocked subscribes w, l's wait for name, to the wake-ups of its wait id: a grant
// handed to it is recorded and the wait woken; a change of the notifier's readiness wakes it
// too. l.mu must be held.
func (l *Lessor) listenWaitLocked(name string, w *queue.Wait) {
	w.Listen(subscribe(l.pool, l.cfg.common.logger, notify.Wakeups, "", notify.Handler{
		Notify: func(payload string) { l.notified(name, w, payload) },
		Ready: func(bool) {
			l.mu.Lock()
			w.Signal()
			l.mu.Unlock()
		},
	}))
}

// notified hands a grant delivered by NOTIFY to the wait w of name it names, and wakes that
// wait. One for a wait that is over is dropped: the wait took its row out of the queue when it
// ended (leaveWait), and got back, and handed on, any grant handed to it before.
func (l *Lessor) notified(name string, w *queue.Wait, payload string) {
	wk, err := queue.ParseWake(payload)
	if err != nil {
		l.cfg.common.logger.Error("fencelock: unreadable notification", "payload", payload, "error", err)
		return
	}
	if wk.Holder != l.cfg.holder || wk.Name != name {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waits[name] == w {
		w.Deliver(wk)
	}
}
