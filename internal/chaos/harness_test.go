package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// doneSlack is how late a healthy in-process holder may see its Done close after the trust
// window ends (goroutine scheduling on a loaded CI machine under -race), beyond the
// scheduler's delay a control timer measured meanwhile (Op.Late, AwaitClosing). The trust window
// itself ends a safety margin (a tenth of the TTL) before the server-side expiry.
const doneSlack = 150 * time.Millisecond

// checkTimeout bounds porcupine per run. The check is CPU-bound, and a loaded machine can make
// it run out of time: porcupine then says unknown (it found no illegal order in time), which
// proves nothing either way, and is logged as such, not counted as a violation
// (dropCheckTimeouts). A history porcupine finds illegal within it is a violation.
const checkTimeout = 20 * time.Second

// dropCheckTimeouts returns vs without the linearizability checks that ran out of time
// ([CheckLinearizable]'s [ErrCheckTimeout], which [CheckRegister] reports as a violation of
// CheckLinearizable), logging each as unknown. An illegal history's violation stays.
func dropCheckTimeouts(t *testing.T, vs []Violation) []Violation {
	t.Helper()
	var kept []Violation
	for _, v := range vs {
		if v.Invariant == "CheckLinearizable" && strings.HasPrefix(v.Detail, ErrCheckTimeout.Error()) {
			t.Logf("chaos: linearizability unknown (not a violation): %s", v.Detail)
			continue
		}
		kept = append(kept, v)
	}
	return kept
}

// A linearizability check that ran out of time is dropped from the violations; one that found
// the history illegal is kept.
func TestDropCheckTimeouts(t *testing.T) {
	timedOut := Violation{"CheckLinearizable", -1, fmt.Errorf("%w after %v (%d operations)", ErrCheckTimeout, checkTimeout, 1000).Error()}
	other := Violation{"NoAckedWriteLost", 3, "lost"}
	require.Equal(t, []Violation{other}, dropCheckTimeouts(t, []Violation{timedOut, other}))

	b := &hb{} // an unknown append with an older token, applied after a newer write
	b.grant("a", 1, 0).grant("b", 2, 1).
		app("b", 2, "b1", OK, 2, 3).
		app("a", 1, "a1", Unknown, 4, 5).
		read(20, Entry("b", 2, "b1"), Entry("a", 1, "a1"))
	vs := dropCheckTimeouts(t, CheckRegister(b.h, map[string]int64{"r": 2}, 0, checkTimeout))
	require.True(t, slices.ContainsFunc(vs, func(v Violation) bool {
		return v.Invariant == "CheckLinearizable" && strings.HasPrefix(v.Detail, ErrNotLinearizable.Error())
	}), "the illegal history's violation was dropped: %v", vs)
}

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

// setupOpts are where scenarios' environments differ. The zero value is a fresh database on
// the shared server, a two-minute deadline, and the database's own pool for everything.
type setupOpts struct {
	// scenario names the scenario in the report.
	scenario string
	// timeout is the context's deadline, from now; 0 means two minutes.
	timeout time.Duration
	// server, if not empty, are the options of a server dedicated to the test (closed at
	// test cleanup, after the database is dropped), on which the database is made instead
	// of on the shared server.
	server []pgtest.Option
	// dbSet, if set, is a "name = value" for ALTER DATABASE ... SET, run before the workers'
	// pool opens, so that the pool's sessions start with it.
	dbSet string
	// poolConfig, if set, adjusts the config of the workers' pool (per-session settings,
	// pool size).
	poolConfig func(*pgxpool.Config)
	// proxy starts an in-process toxiproxy in front of the server (see newToxiProxy) and
	// opens the holders' pool through it.
	proxy bool
}

// env is a scenario's environment, made by setup. Everything in it ends at test cleanup, in
// this order: the workers' own pool and the holders' pool (those there are) close, the
// context is cancelled, the proxy stops, db.Pool closes and the database is dropped, and a
// dedicated server closes.
type env struct {
	ctx context.Context // the test's context, with its deadline
	// db is the test's database. db.Pool (default settings) is the harness pool, and the
	// workers' unless they get a pool of their own; db.Server is the server it lives on.
	db *pgtest.DB
	// pool is the workers' pool: a pool of its own, opened after dbSet and with poolConfig,
	// if either is set, else db.Pool.
	pool   *pgxpool.Pool
	tp     *toxiProxy    // the proxy, if setupOpts.proxy (else nil)
	hpool  *pgxpool.Pool // the holders' pool, through tp, if setupOpts.proxy (else nil)
	report *Report       // the scenario's report, named setupOpts.scenario
}

// setup makes the environment of a scenario described by o: the database (on a dedicated
// server if o.server is set), the proxy and the holders' pool if o.proxy, the context, the
// database setting o.dbSet, and the workers' pool, registering their cleanup with t. It
// skips the test (go test -short) or fails it as pgtest does when PostgreSQL is missing.
func setup(t *testing.T, o setupOpts) *env {
	t.Helper()
	var db *pgtest.DB
	if len(o.server) > 0 {
		db = pgtest.NewServer(t, o.server...).NewDB(t)
	} else {
		db = pgtest.NewDB(t)
	}
	e := &env{db: db, pool: db.Pool, report: &Report{Scenario: o.scenario}}
	var hcfg *pgxpool.Config
	if o.proxy { // before the context: the proxy stops after it is cancelled
		e.tp, hcfg = newToxiProxy(t, db.URL)
	}
	if o.timeout == 0 {
		o.timeout = 2 * time.Minute
	}
	var cancel context.CancelFunc
	e.ctx, cancel = context.WithTimeout(context.Background(), o.timeout)
	t.Cleanup(cancel) // after the pools close (cleanups run last registered first)
	if o.dbSet != "" {
		_, err := db.Pool.Exec(e.ctx, fmt.Sprintf(`ALTER DATABASE %s SET %s`, pgx.Identifier{db.Name}.Sanitize(), o.dbSet))
		require.NoError(t, err)
	}
	if o.proxy {
		hpool, err := pgxpool.NewWithConfig(e.ctx, hcfg)
		require.NoError(t, err)
		t.Cleanup(hpool.Close)
		e.hpool = hpool
	}
	if o.dbSet != "" || o.poolConfig != nil {
		cfg, err := pgxpool.ParseConfig(db.URL)
		require.NoError(t, err)
		if o.poolConfig != nil {
			o.poolConfig(cfg)
		}
		pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		e.pool = pool
	}
	return e
}

// newRecorder measures the clock offset on pool and returns a fresh recorder.
func newRecorder(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *Recorder {
	t.Helper()
	off, err := MeasureOffset(ctx, pool)
	require.NoError(t, err)
	return NewRecorder(off)
}

// newRun sets up register name on pool (SetupRegister) for a run of a scenario and returns the
// run's recorder, its clock offset measured on pool.
func newRun(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) *Recorder {
	t.Helper()
	require.NoError(t, SetupRegister(ctx, pool, name))
	return newRecorder(t, ctx, pool)
}

// backoffUpTo is the workers' backoff between tries: exponential from 1 ms up to most.
func backoffUpTo(most time.Duration) fencelock.LessorOption {
	return fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, most))
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
	opts   []fencelock.LessorOption
	// pause, if set, runs between the holder's own validity check and its write.
	pause func()
	// guard makes every append run Lease.GuardTx first, in its transaction.
	guard bool
	// onDone, if set, is called with each lease when its Done closes (before it is recorded).
	onDone func(*fencelock.Lease, time.Duration)
	// election makes the worker a candidate of the election name: each grant is a term won
	// by Election.Campaign, each release a Term.Resign.
	election bool
}

// run loops until ctx ends.
func (w *leaseWorker) run(ctx context.Context) {
	l, err := fencelock.NewLessor(w.pool, append([]fencelock.LessorOption{fencelock.WithHolder(w.worker)}, w.opts...)...)
	if err != nil {
		panic(err)
	}
	app := &Appender{Pool: w.pool, Rec: w.rec, Worker: w.worker, Holder: w.worker}
	var watchers sync.WaitGroup
	defer watchers.Wait()
	var election *fencelock.Election
	if w.election {
		if election, err = fencelock.NewElection(l, w.name, w.ttl); err != nil {
			panic(err)
		}
	}
	for ctx.Err() == nil {
		var lease *fencelock.Lease
		var ok bool
		if election != nil {
			lease, ok = campaignRecorded(ctx, w.rec, election, w.worker)
		} else {
			lease, ok = acquireRecorded(ctx, w.rec, l, w.worker, w.name, w.ttl)
		}
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
	late := AwaitClosing(lease.Done(), lease.TrustedUntil)
	now := w.rec.Now()
	if w.onDone != nil {
		w.onDone(lease, now)
	}
	w.rec.Record(Op{Worker: w.worker, Kind: KindDone, Name: lease.Name(), Token: int64(lease.Token()), Expires: lease.ExpiresAt(), Err: fmt.Sprint(lease.Err()), Invoke: now, Return: now, Late: late})
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

// campaignRecorded runs Election.Campaign and records the term won as a grant of the
// election's name (a term is a lease of it).
func campaignRecorded(ctx context.Context, rec *Recorder, e *fencelock.Election, worker string) (*fencelock.Lease, bool) {
	id := rec.Invoke(Op{Worker: worker, Kind: KindGrant, Name: e.Name(), Holder: worker})
	term, err := e.Campaign(ctx, worker)
	if err != nil {
		outcome := Unknown
		if ctx.Err() != nil || errors.Is(err, fencelock.ErrInvalidArgument) {
			outcome = Fail // a cancelled campaign leaves nothing held
		}
		rec.Complete(id, outcome, err, nil)
		return nil, false
	}
	lease := term.Lease()
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
	vs := dropCheckTimeouts(t, CheckRegister(h, fences, doneSlack, checkTimeout))
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
