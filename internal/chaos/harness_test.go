package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// doneSlack is how late a healthy in-process holder may see its Done close after the trust
// window ends (goroutine scheduling on a loaded CI machine under -race). The trust window
// itself ends a safety margin (a tenth of the TTL) before the server-side expiry.
const doneSlack = 150 * time.Millisecond

// checkTimeout bounds porcupine per run.
const checkTimeout = 20 * time.Second

// runs returns how many times a scenario runs: n by default, FENCELOCK_CHAOS_RUNS if set.
func runs(n int) int {
	if v, err := strconv.Atoi(os.Getenv("FENCELOCK_CHAOS_RUNS")); err == nil && v > 0 {
		return v
	}
	return n
}

// jitter returns a uniform random duration in [lo, hi].
func jitter(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rand.Int64N(int64(hi-lo)+1))
}

// newRecorder measures the clock offset on pool and returns a fresh recorder.
func newRecorder(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *Recorder {
	t.Helper()
	off, err := MeasureOffset(ctx, pool)
	require.NoError(t, err)
	return NewRecorder(off)
}

// leaseWorker takes lease name in a loop and makes fenced appends while its own check says
// the lease is held; it records grants, checks, appends, Done closings and releases.
type leaseWorker struct {
	rec    *Recorder
	pool   *pgxpool.Pool
	worker string
	name   string
	ttl    time.Duration
	writes int           // appends per grant
	gap    time.Duration // pause between appends
	opts   []fencelock.Option
	// pause, if set, runs between the holder's own validity check and its write.
	pause func()
	// guard makes every append run Lease.GuardTx first, in its transaction.
	guard bool
	// onDone, if set, is called with each lease when its Done closes (before it is recorded).
	onDone func(*fencelock.Lease, time.Duration)
}

// run loops until ctx ends.
func (w *leaseWorker) run(ctx context.Context) {
	l, err := fencelock.NewLessor(w.pool, append([]fencelock.Option{fencelock.WithHolder(w.worker)}, w.opts...)...)
	if err != nil {
		panic(err)
	}
	app := &Appender{Pool: w.pool, Rec: w.rec, Worker: w.worker, Holder: w.worker}
	var watchers sync.WaitGroup
	defer watchers.Wait()
	for ctx.Err() == nil {
		lease, ok := acquireRecorded(ctx, w.rec, l, w.worker, w.name, w.ttl)
		if !ok {
			sleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		watchers.Go(func() { w.watch(lease) })
		for range w.writes {
			if !checkHeld(w.rec, w.worker, lease) {
				break
			}
			if w.guard {
				app.Guard = lease.GuardTx
			}
			if w.pause != nil {
				w.pause()
			}
			_ = app.Append(ctx, w.name, lease.Token())
			sleepCtx(ctx, w.gap)
		}
		releaseRecorded(w.rec, w.worker, lease)
	}
}

// watch records the closing of lease's Done.
func (w *leaseWorker) watch(lease *fencelock.Lease) {
	<-lease.Done()
	now := w.rec.Now()
	if w.onDone != nil {
		w.onDone(lease, now)
	}
	w.rec.Record(Op{Worker: w.worker, Kind: KindDone, Name: lease.Name(), Token: int64(lease.Token()), Expires: lease.ExpiresAt(), Err: fmt.Sprint(lease.Err()), Invoke: now, Return: now})
}

// acquireRecorded runs Lessor.Acquire and records it as a grant.
func acquireRecorded(ctx context.Context, rec *Recorder, l *fencelock.Lessor, worker, name string, ttl time.Duration) (*fencelock.Lease, bool) {
	id := rec.Invoke(Op{Worker: worker, Kind: KindGrant, Name: name, Holder: worker})
	lease, err := l.Acquire(ctx, name, ttl)
	if err != nil {
		outcome := Unknown
		if ctx.Err() != nil || errors.Is(err, fencelock.ErrInvalidArgument) {
			outcome = Fail // a cancelled acquire leaves nothing held (documented)
		}
		rec.Complete(id, outcome, err, nil)
		return nil, false
	}
	rec.Complete(id, OK, nil, func(op *Op) { op.Token, op.Expires = int64(lease.Token()), lease.ExpiresAt() })
	return lease, true
}

// releaseRecorded releases lease with a fresh context and records it.
func releaseRecorded(rec *Recorder, worker string, lease *fencelock.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id := rec.Invoke(Op{Worker: worker, Kind: KindRelease, Name: lease.Name(), Token: int64(lease.Token())})
	err := lease.Release(ctx)
	rec.Complete(id, Classify(err), err, nil)
}

// finalCheck reads the final ledgers and fences of names, then checks the history with every
// fenced-register invariant and porcupine, and adds the run to report.
func finalCheck(t *testing.T, ctx context.Context, pool *pgxpool.Pool, rec *Recorder, report *Report, names ...string) History {
	t.Helper()
	fences := map[string]int64{}
	for _, name := range names {
		_, err := ReadLedger(ctx, pool, rec, "checker", name)
		require.NoError(t, err)
		hw, err := FenceOf(ctx, pool, name)
		require.NoError(t, err)
		fences[name] = hw
	}
	h := rec.History()
	vs := CheckRegister(h, fences, doneSlack, checkTimeout)
	for _, v := range vs {
		t.Errorf("violation: %v", v)
	}
	report.AddRun(h, vs)
	return h
}

// logReport logs the report's parseable line and fails the test on a violation.
func logReport(t *testing.T, r *Report) {
	t.Helper()
	t.Log(r.Line())
	require.Empty(t, r.Violations())
}

// stale counts the appends of worker rejected as stale.
func staleCount(h History, worker string) int {
	n := 0
	for _, op := range h {
		if op.Kind == KindAppend && op.Worker == worker && op.Stale {
			n++
		}
	}
	return n
}

// doneDetect returns, for each Done closing in h of a lease that was lost (not released),
// the time from the server-side expiry to the closing (negative: before the expiry).
func doneDetect(h History) []time.Duration {
	var out []time.Duration
	for _, op := range h {
		if op.Kind == KindDone && op.Err != fencelock.ErrReleased.Error() && !op.Expires.IsZero() {
			out = append(out, op.ServerReturn.Sub(op.Expires))
		}
	}
	return out
}
