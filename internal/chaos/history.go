package chaos

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Outcome is what became of an operation.
type Outcome int

const (
	// Pending marks an operation whose result was never recorded (its process died). Checkers
	// treat it as [Unknown].
	Pending Outcome = iota
	// OK: the operation happened and was acknowledged.
	OK
	// Fail: the operation definitely did not happen (rolled back, refused, never sent).
	Fail
	// Unknown: the operation may or may not have happened (a connection broke in flight).
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Fail:
		return "fail"
	case Unknown:
		return "unknown"
	default:
		return "pending"
	}
}

// Kind is the kind of an operation.
type Kind string

// Operation kinds.
const (
	KindGrant     Kind = "grant"     // a lease or lock granted: Token, Holder, Expires
	KindAppend    Kind = "append"    // a fenced append of Value to the ledger of Name
	KindRead      Kind = "read"      // a read of the ledger of Name: Entries
	KindCheck     Kind = "check"     // the holder's own validity check found the lock held
	KindDone      Kind = "done"      // the holder saw Done close
	KindRelease   Kind = "release"   // the holder released the lock
	KindFault     Kind = "fault"     // a fault was injected (Value says which)
	KindDecrement Kind = "decrement" // inventory: Amount taken from the stock of Name
	KindCapture   Kind = "capture"   // payments: order Name captured
)

// Op is one operation of a history: its invocation and, once known, its result.
type Op struct {
	ID      int     // index in the history
	Worker  string  // who ran it
	Kind    Kind    // what it was
	Name    string  // the lock name or resource
	Token   int64   // the fencing token it carried or was granted
	Holder  string  // the holder id
	Value   string  // the ledger entry appended, or a fault's description
	Amount  int     // the amount decremented
	Outcome Outcome // what became of it
	Err     string  // the error, for Fail and Unknown
	Stale   bool    // rejected with a stale-token error
	Current int64   // the high-water mark the stale-token error reported

	// Invoke and Return are local monotonic times since the recorder started. Return is
	// meaningless for Pending and Unknown operations, which may take effect at any time after
	// Invoke.
	Invoke, Return time.Duration
	// ServerInvoke and ServerReturn are the same instants on the database clock, estimated
	// from a measured offset. ServerAt, when set, was read with clock_timestamp() in the
	// operation's own transaction.
	ServerInvoke, ServerReturn, ServerAt time.Time
	// Expires is the lease's expiry on the database clock, as the holder knew it (grant,
	// check, done).
	Expires time.Time
	// Entries is what a read returned.
	Entries []string
	// Late, for a Done closing, is how late a control timer of the watching goroutine was at
	// worst after the trust window ended (see [AwaitClosing]): the scheduler's delay, which
	// [TrustWithinExpiry] adds to its slack.
	Late time.Duration
}

// Finished reports whether the operation has a definite result (OK or Fail).
func (op *Op) Finished() bool { return op.Outcome == OK || op.Outcome == Fail }

func (op Op) String() string {
	return fmt.Sprintf("#%d %s %s %s token=%d value=%q %s %s", op.ID, op.Worker, op.Kind, op.Name, op.Token, op.Value, op.Outcome, op.Err)
}

// History is a recorded list of operations, in invocation order.
type History []Op

// Recorder records a history. It is safe for concurrent use.
type Recorder struct {
	start  time.Time     // local, with a monotonic reading
	offset time.Duration // database clock minus local wall clock

	// Sink, if set before use, is called (under the recorder's lock) with "invoke",
	// "complete" or "record" and the operation, as each is recorded: a child process streams
	// its history to the test this way.
	Sink func(ev string, op Op)

	mu  sync.Mutex
	ops []Op
}

// NewRecorder returns an empty recorder whose clock starts now. offset is the database clock
// minus the local wall clock (see [MeasureOffset]); on one host it is close to zero.
func NewRecorder(offset time.Duration) *Recorder {
	return &Recorder{start: time.Now(), offset: offset}
}

// Now returns the local monotonic time since the recorder started.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// ServerTime returns the database-clock estimate of d, a time since the recorder started.
func (r *Recorder) ServerTime(d time.Duration) time.Time {
	return r.start.Round(0).Add(d + r.offset)
}

// Since converts a local wall-clock time (from another process on this host) into the
// recorder's time base.
func (r *Recorder) Since(wall time.Time) time.Duration { return wall.Sub(r.start.Round(0)) }

// Invoke records the invocation of op now and returns its id for [Recorder.Complete].
func (r *Recorder) Invoke(op Op) int {
	now := r.Now()
	op.Invoke, op.ServerInvoke = now, r.ServerTime(now)
	op.Outcome = Pending
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = len(r.ops)
	r.ops = append(r.ops, op)
	r.sink("invoke", op)
	return op.ID
}

func (r *Recorder) sink(ev string, op Op) {
	if r.Sink != nil {
		r.Sink(ev, op)
	}
}

// Wall returns the local wall-clock time of d, a time since the recorder started.
func (r *Recorder) Wall(d time.Duration) time.Time { return r.start.Round(0).Add(d) }

// InvokeAt records the invocation of op at wall, a wall-clock time of this host (from a child
// process's [Recorder.Wall]), and returns its id.
func (r *Recorder) InvokeAt(op Op, wall time.Time) int {
	op.Invoke = r.Since(wall)
	op.ServerInvoke = r.ServerTime(op.Invoke)
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = len(r.ops)
	r.ops = append(r.ops, op)
	return op.ID
}

// CompleteAt records res, the completed operation as a child process recorded it, as the
// result of operation id, returned at wall.
func (r *Recorder) CompleteAt(id int, res Op, wall time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.ops[id]
	invoke, serverInvoke := op.Invoke, op.ServerInvoke
	*op = res
	op.ID, op.Invoke, op.ServerInvoke = id, invoke, serverInvoke
	op.Return = r.Since(wall)
	op.ServerReturn = r.ServerTime(op.Return)
}

// Complete records the result of operation id now: its outcome and err (nil for OK), after
// fill, if not nil, has set the fields the result carries (Token, ServerAt, Entries, ...).
func (r *Recorder) Complete(id int, outcome Outcome, err error, fill func(*Op)) {
	now := r.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.ops[id]
	op.Return, op.ServerReturn = now, r.ServerTime(now)
	op.Outcome = outcome
	if err != nil {
		op.Err = err.Error()
	}
	if fill != nil {
		fill(op)
	}
	r.sink("complete", *op)
}

// Record records op, an instantaneous event or one whose times are already set (Invoke and
// Return nonzero), and returns its id.
func (r *Recorder) Record(op Op) int {
	if op.Invoke == 0 && op.Return == 0 {
		now := r.Now()
		op.Invoke, op.Return = now, now
	}
	op.ServerInvoke, op.ServerReturn = r.ServerTime(op.Invoke), r.ServerTime(op.Return)
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = len(r.ops)
	r.ops = append(r.ops, op)
	r.sink("record", op)
	return op.ID
}

// History returns a copy of the operations recorded so far.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := slices.Clone(r.ops)
	for i := range h {
		h[i].Entries = slices.Clone(h[i].Entries)
	}
	return h
}

// Count returns how many operations of kind k the history holds.
func (h History) Count(k Kind) int {
	n := 0
	for _, op := range h {
		if op.Kind == k {
			n++
		}
	}
	return n
}
