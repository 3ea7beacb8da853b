// Package queue is the client's bookkeeping of waits in a queue of fencelock.lease_waiters (a
// lease's) or fencelock.semaphore_waiters (a semaphore's), the part with no SQL and no public
// face: wait ids, a lessor's wait for one name and the grants handed to it by NOTIFY until an
// attempt claims them, and the wake-up payload.
//
// # Its narrow interface
//
// A [Wait] is guarded by its owner's mutex (the lessor's): every method but [NewWait] must be
// called with it held. A wait listens through a [Subscription] (internal/notify's) keyed by its
// id, which follows the id when the wait takes a new one ([Wait.Listen]). [ParseWake] reads the payload
// that fencelock.hand_off, fencelock.semaphore_release and fencelock.semaphore_wake send;
// [NewWaitID] numbers waits for the whole process; [CountWakeup] and [WakeupsSent] count the
// NOTIFYs of this process's releases. The statements that take, refresh and leave places
// (LeaseAcquire, LeaseJoinQueue, LeaseLeaveQueue, SemaphoreAcquire, SemaphoreLeave) run in
// the root package, which owns the lessor's connections.
//
// # Where the idea comes from
//
// The queue is the fair lock of the ZooKeeper recipes (Hunt et al., 2010) and etcd's mutex,
// with the hand-off made by the release itself: a grant handed to a wait is delivered with its
// token and expiry, so the wait claims it without a statement.
package queue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Handoff is a grant a release handed to a wait: its fencing token (> 0) and its expiry on
// the database clock.
type Handoff struct {
	Token     int64
	ExpiresAt time.Time
	WaitID    int64 // the wait it was handed to (0 when found by a statement)
}

// Wakeup is one notification of a release: the wait it wakes, and the grant handed to it
// (Token 0: none; the lease or permit is free, try now).
type Wakeup struct {
	Holder, Name string
	WaitID       int64
	Handoff
}

// ParseWake reads a wake-up payload:
// "<wait_id> <token> <expires_at, µs> <octets of holder> <holder><name>". Errors: a
// description of what is malformed.
func ParseWake(payload string) (Wakeup, error) {
	f := strings.SplitN(payload, " ", 5)
	if len(f) != 5 {
		return Wakeup{}, fmt.Errorf("want 5 fields, got %d", len(f))
	}
	waitID, err1 := strconv.ParseInt(f[0], 10, 64)
	token, err2 := strconv.ParseInt(f[1], 10, 64)
	us, err3 := strconv.ParseInt(f[2], 10, 64)
	n, err4 := strconv.Atoi(f[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Wakeup{}, err
	}
	if n < 0 || n > len(f[4]) {
		return Wakeup{}, fmt.Errorf("holder of %d bytes in %d", n, len(f[4]))
	}
	return Wakeup{Holder: f[4][:n], Name: f[4][n:], WaitID: waitID,
		Handoff: Handoff{Token: token, ExpiresAt: time.UnixMicro(us)}}, nil
}

// Key returns the notifier key of the wait id: the first field of the payloads that wake it.
func Key(waitID int64) string { return strconv.FormatInt(waitID, 10) }

// waitIDs numbers waits; it starts at random, so a wait_id left in a table by an earlier
// process with the same holder id is not taken for one of this process's.
var waitIDs atomic.Int64

func init() { waitIDs.Store(rand.Int64N(1 << 60)) }

// NewWaitID returns a wait id unique in this process. Safe for concurrent use.
func NewWaitID() int64 { return waitIDs.Add(1) }

// wakeups counts the wake-ups sent by this process's releases: NOTIFYs, and deliveries to a
// waiter of this process without one (notify.Deliver).
var wakeups atomic.Int64

// CountWakeup counts one wake-up sent by a release of this process (a NOTIFY, or a delivery
// in the process). Safe for concurrent use.
func CountWakeup() { wakeups.Add(1) }

// WakeupsSent returns how many wake-ups (NOTIFYs, or deliveries in the process) this
// process's releases have sent (tests and benchmarks read it). Safe for concurrent use.
func WakeupsSent() int64 { return wakeups.Load() }

// Wait is one lessor's wait for one name. The lessor's goroutines waiting on the name share
// it, and its row in the queue (one row per name and holder). Guarded by the lessor's mutex.
type Wait struct {
	// ID is the wait_id of its row; a new one once a grant handed to it is used up.
	ID int64
	// Refs counts the goroutines waiting on it.
	Refs int
	// Sent and ServerNow are of the wait's last statement: when it was sent (local clock) and
	// the database clock during it, which map a handed grant's expiry onto the local clock.
	Sent, ServerNow time.Time

	wake    chan struct{}  // closed, and replaced, to wake the goroutines
	handed  []Handoff      // grants delivered by NOTIFY, not claimed yet
	claimed map[int64]bool // tokens handed to this wait and claimed by one of its attempts
	sub     Subscription   // its notifications, keyed by ID; nil while not listening
}

// NewWait returns a wait with a new id and no goroutine on it.
func NewWait() *Wait { return &Wait{ID: NewWaitID(), wake: make(chan struct{})} }

// Wake returns the channel that the next Signal closes.
func (w *Wait) Wake() <-chan struct{} { return w.wake }

// Signal wakes every goroutine waiting on the channel Wake returned.
func (w *Wait) Signal() {
	close(w.wake)
	w.wake = make(chan struct{})
}

// Subscription is what a wait needs of its subscription to the pool's notifier
// (*notify.Subscription): to route the wake-ups of a new id to it, and to end it.
type Subscription interface {
	SetKey(key string)
	Close()
}

// Listen makes sub the wait's subscription, keyed by its id from now on (the wait re-keys it
// when its id changes); Listening then reports true. Close ends it.
func (w *Wait) Listen(sub Subscription) {
	w.sub = sub
	sub.SetKey(Key(w.ID))
}

// Listening reports whether the wait has a subscription.
func (w *Wait) Listening() bool { return w.sub != nil }

// Deliver records the grant wk hands to the wait (if any) and wakes it, when wk is for its
// current id; it reports whether it was. One for an earlier id is dropped: that id got one
// grant only, which an attempt found in its own statement and claimed or handed on already.
func (w *Wait) Deliver(wk Wakeup) bool {
	if w.ID != wk.WaitID {
		return false
	}
	if wk.Token != 0 {
		h := wk.Handoff
		h.WaitID = wk.WaitID
		w.handed = append(w.handed, h)
	}
	w.Signal()
	return true
}

// Pending reports whether grants were delivered that no attempt took yet.
func (w *Wait) Pending() bool { return len(w.handed) > 0 }

// HandedTokens returns the tokens of the grants delivered and not taken yet.
func (w *Wait) HandedTokens() []int64 {
	t := make([]int64, 0, len(w.handed))
	for _, h := range w.handed {
		t = append(t, h.Token)
	}
	return t
}

// TakeHanded returns the grants handed to the wait's current id by NOTIFY, and gives the wait a
// new id when there were any: its row is used up (a later refresh must join the queue again,
// not find the same grant). A grant handed to an earlier id is dropped (see Deliver).
func (w *Wait) TakeHanded() []Handoff {
	var h []Handoff
	for _, e := range w.handed {
		if e.WaitID == w.ID {
			h = append(h, e)
		}
	}
	w.handed = nil
	if len(h) > 0 {
		w.setID(NewWaitID())
	}
	return h
}

// RenewID gives the wait a new id, dropping the grants handed to the old one (see
// TakeHanded), after its row's grant was found by a statement: that attempt claims it, or
// hands it on.
func (w *Wait) RenewID() {
	w.setID(NewWaitID())
	w.handed = nil
}

func (w *Wait) setID(id int64) {
	w.ID = id
	if w.sub != nil {
		w.sub.SetKey(Key(id))
	}
}

// NoteClaim records that an attempt of the wait claimed the grant with token, so that leaving
// the queue does not hand on a grant the lessor took (and may be releasing itself right now).
func (w *Wait) NoteClaim(token int64) {
	if w.claimed == nil {
		w.claimed = make(map[int64]bool)
	}
	w.claimed[token] = true
}

// Close ends the wait's subscription and returns, for its last goroutine to hand on what no
// attempt claimed, the tokens of the grants delivered and not taken, and the tokens its
// attempts claimed (see NoteClaim; the caller reads the map after unlocking: no attempt is
// left to write it).
func (w *Wait) Close() (handed []int64, claimed map[int64]bool) {
	if w.sub != nil {
		w.sub.Close()
		w.sub = nil
	}
	handed = w.HandedTokens()
	w.handed = nil
	return handed, w.claimed
}
