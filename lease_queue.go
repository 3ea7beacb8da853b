package fencelock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/timing"
)

// The queue of lease waiters, the client's side (the server's is migrations/00004 and
// sqlc/queries/queue.sql). A waiting Acquire joins the name's queue with its first refused
// attempt and is served first come, first served: a release hands the lease to the head of the
// queue in its own statement and wakes only that waiter, through its lessor's listening
// connection (listener.go). While anyone waits, no attempt from outside the queue is granted
// (TryAcquire does not barge). A waiter refreshes its place every third of its liveness
// (queueLiveness); one that dies leaves the queue when its row expires, one that gives up
// deletes its row, and hands on a grant it was handed meanwhile.

// wait is one lessor's wait for one name. The lessor's goroutines in Acquire on the name share
// it and its row in fencelock.lease_waiters (one row per name and holder). Guarded by the
// lessor's mu.
type wait struct {
	id      int64          // wait_id of its row; a new one once a grant handed to it is used up
	refs    int            // goroutines in Acquire on it
	wake    chan struct{}  // closed, and replaced, to wake them
	handed  []handoff      // grants delivered by NOTIFY, not claimed yet
	claimed map[Token]bool // grants handed to this wait and claimed by one of its attempts
	// The last statement of this wait: when it was sent (local clock) and the database clock
	// during it, which map a handed grant's expiry onto the local clock.
	sent, serverNow time.Time
}

// noteClaim records that an attempt of w claimed lease (nil: none), so that leaving the queue
// does not hand on a grant this lessor took (and may be releasing itself right now).
func (w *wait) noteClaim(l *Lessor, lease *Lease) {
	if lease == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.claimed == nil {
		w.claimed = make(map[Token]bool)
	}
	w.claimed[lease.token] = true
}

func (w *wait) signalLocked() {
	close(w.wake)
	w.wake = make(chan struct{})
}

// waitIDs numbers waits; it starts at random, so a wait_id left in the table by an earlier
// process with the same holder id is not taken for one of this process's.
var waitIDs atomic.Int64

func init() { waitIDs.Store(rand.Int64N(1 << 60)) }

func newWaitID() int64 { return waitIDs.Add(1) }

// wakeups counts the NOTIFYs sent by this process's releases (tests and benchmarks read it).
var wakeups atomic.Int64

// joinWait registers a goroutine waiting for name and returns its wait.
func (l *Lessor) joinWait(name string) *wait {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.waits[name]
	if w == nil {
		w = &wait{id: newWaitID(), wake: make(chan struct{})}
		l.waits[name] = w
	}
	w.refs++
	return w
}

// leaveWait unregisters a goroutine's wait. The last one out takes the wait's row out of the
// queue, unless it was granted a TTL lease (the grant's statement did, or the hand-off marked
// it), and hands on every grant handed to the wait that no Acquire claimed. It runs detached
// from ctx: a cancelled wait must not stay in the queue.
func (l *Lessor) leaveWait(ctx context.Context, name string, w *wait, granted bool) {
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
	w.refs--
	if granted {
		w.signalLocked() // the lessor's other goroutines on name: ErrAlreadyHeld
	}
	if w.refs > 0 {
		l.mu.Unlock()
		return
	}
	delete(l.waits, name)
	handed, claimed := w.handed, w.claimed
	w.handed = nil
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
			handed = append(handed, handoff{token: Token(row.GrantedToken)})
		}
	}
	for _, h := range handed {
		if !claimed[h.token] {
			l.releaseUnclaimedLocked(cctx, name, h.token)
		}
	}
}

// notified hands a grant delivered by NOTIFY to the wait it names, and wakes that wait. One
// for a wait that is over is dropped: the wait took its row out of the queue when it ended
// (leaveWait), and got back, and handed on, any grant handed to it before.
func (l *Lessor) notified(wk wakeup) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sw := l.semWaits[wk.waitID]; sw != nil { // a Semaphore.Acquire (wait ids are unique)
		if wk.token != 0 { // a permit given to it (the name is the permit's)
			sw.handed = &wk
		}
		select {
		case sw.wake <- struct{}{}:
		default:
		}
		return
	}
	w := l.waits[wk.name]
	if w == nil || w.id != wk.waitID {
		return
	}
	if wk.token != 0 {
		h := wk.handoff
		h.waitID = wk.waitID
		w.handed = append(w.handed, h)
	}
	w.signalLocked()
}

// takeHandedLocked returns the grants handed to w's current id by NOTIFY, and gives w a new id
// when there were any: its row is used up (a later refresh must join the queue again, not find
// the same grant). A grant handed to an earlier id of w is dropped: that id got one grant
// only, which an attempt found in its own statement (outcomes 2 and 3) and claimed or handed
// on already. l.mu must be held.
func (w *wait) takeHandedLocked() []handoff {
	var h []handoff
	for _, e := range w.handed {
		if e.waitID == w.id {
			h = append(h, e)
		}
	}
	w.handed = nil
	if len(h) > 0 {
		w.id = newWaitID()
	}
	return h
}

// renewIDLocked gives w a new id, dropping the grants handed to the old one (see
// takeHandedLocked), after its row's grant was found by a statement: that attempt claims it,
// or hands it on. Not after an attempt of unknown outcome: its cleanup spares a grant handed
// to w (LeaseReleaseUnknown), which w's next attempt must still find under the same id (see
// Lessor.attempt). l.mu must be held.
func (w *wait) renewIDLocked() {
	w.id = newWaitID()
	w.handed = nil
}

// claim makes a lease of a grant a release handed to a wait of this lessor, with h's token and
// expiry. The trust window is mapped onto the local clock through a statement sent at sent
// (local) during which the database clock read serverNow (handedGrantSent). A grant whose
// window has already ended, or that no statement can map, is handed on, and the claim
// refused. The caller holds name's gate.
func (l *Lessor) claim(ctx context.Context, name string, lt leaseTimes, h handoff, sent, serverNow time.Time) (*Lease, error) {
	if l.holds(name) {
		return nil, fmt.Errorf("acquire lease %q: %w", name, ErrAlreadyHeld)
	}
	now := l.cfg.clock.Now()
	grantedAt, ok := timing.HandedGrantSent(sent, serverNow, h.expiresAt, lt.TTL, now)
	if !ok {
		l.releaseToken(ctx, name, h.token)
		return nil, errRefused
	}
	lease := newLease(l, name, h.token, lt, grantedAt, h.expiresAt)
	if !now.Before(lease.TrustedUntil()) {
		lease.end(ErrReleased)
		l.releaseToken(ctx, name, h.token)
		return nil, errRefused
	}
	l.add(lease)
	return lease, nil
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

// releaseToken ends the grant (name, this holder, token) with LeaseRelease, detached from
// ctx's cancellation: a grant nobody will use must not stay held for a TTL. Errors are logged.
func (l *Lessor) releaseToken(ctx context.Context, name string, token Token) {
	rctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	if _, err := l.releaseStatement(rctx, name, token); err != nil {
		l.cfg.common.logger.Error("fencelock: could not end a grant nobody uses; it expires by its TTL",
			"lease", name, "token", int64(token), "holder", l.cfg.holder, "error", err)
	}
}

// releaseStatement runs LeaseRelease for (name, this holder, token): it ends the grant and
// hands it to the head of the queue, if any. It reports whether the grant was still current.
func (l *Lessor) releaseStatement(ctx context.Context, name string, token Token) (bool, error) {
	outcome, err := l.q.LeaseRelease(ctx, l.pool, db.LeaseReleaseParams{Name: name, Holder: l.cfg.holder, Token: int64(token)})
	if err != nil {
		return false, wrapPg(fmt.Sprintf("release lease %q", name), err)
	}
	if outcome == releaseHandedWoken {
		wakeups.Add(1)
	}
	return outcome != releaseNotCurrent, nil
}

// The outcomes of LeaseRelease (fencelock.hand_off).
const (
	releaseNotCurrent  = 0 // the grant had expired or been taken over: nothing changed
	releaseReleased    = 1 // released, not handed over
	releaseHanded      = 2 // handed to the head of the queue, which polls
	releaseHandedWoken = 3 // handed to the head of the queue, and woken by NOTIFY
)

// acquireQueued is Acquire's loop: attempts, in the name's queue from the first refusal on,
// until granted or ctx ends.
func (l *Lessor) acquireQueued(ctx context.Context, name string, lt leaseTimes) (lease *Lease, err error) {
	live := timing.QueueLiveness(lt.TTL)
	err = l.waitInQueue(ctx, "acquire lease", name, live, true, func(w *wait, _ func()) (a attemptInfo, err error) {
		lease, a, err = l.attempt(ctx, name, lt, w, live)
		return a, err
	})
	return lease, err
}

// waitInQueue calls attempt until it returns anything but errRefused, or ctx ends (then it
// returns ctx's cause, wrapped with what and name). The wait joins the name's queue with its
// first refused attempt; between attempts it sleeps queueWait, unless a release wakes it.
// granting: a successful attempt ends the wait's place itself (a TTL grant's statement
// deletes it, a hand-off marks it); otherwise (RunLocked) the place is left when the call ends.
// attempt's second argument ends the call's count as waiting (metrics.go), for an attempt
// that got what it waited for and goes on to use it (a RunLocked's fn); it is idempotent,
// and the wait ends it anyway when it returns.
func (l *Lessor) waitInQueue(ctx context.Context, what, name string, live time.Duration, granting bool, attempt func(w *wait, stopWaiting func()) (attemptInfo, error)) (err error) {
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
		wake := w.wake
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
		var handed []handoff
		if !granting {
			// A RunLocked takes no TTL grant; one handed to its wait (an Acquire of the same
			// lessor on the name shared it and has left) is handed on.
			handed = w.takeHandedLocked()
		}
		pending := len(w.handed) > 0
		l.mu.Unlock()
		for _, h := range handed {
			l.releaseUnclaimed(ctx, name, h.token)
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

// joinQueue puts a RunLocked that was refused in the name's queue, or refreshes its place.
func (l *Lessor) joinQueue(ctx context.Context, name string, w *wait, live time.Duration) (attemptInfo, error) {
	l.mu.Lock()
	id, channel := w.id, l.listeningChannelLocked()
	l.mu.Unlock()
	row, err := l.q.LeaseJoinQueue(ctx, l.pool, db.LeaseJoinQueueParams{Name: name, Holder: l.cfg.holder, WaitID: id, Channel: channel, LiveUs: live.Microseconds()})
	if err != nil {
		return attemptInfo{}, wrapPg(fmt.Sprintf("run locked %q: join the queue", name), err)
	}
	return attemptInfo{joined: row.Joined, listening: channel != "", ahead: row.Ahead, remaining: time.Duration(row.RemainingUs) * time.Microsecond}, nil
}

// joinRecheck: a wait that joined a queue at its head tries again this soon, once, in case a
// release ran concurrently with its joining and, not seeing it yet, woke nobody.
const joinRecheck = 20 * time.Millisecond

// attemptInfo is what a refused attempt tells the next one's timing.
type attemptInfo struct {
	joined    bool          // the attempt joined the queue (a new place, not a refresh)
	listening bool          // the attempt carried the lessor's NOTIFY channel
	ahead     int64         // live waiters ahead
	remaining time.Duration // the holder's remaining TTL (0: free or unknown)
}
