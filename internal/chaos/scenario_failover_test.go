package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
)

// failoverTTL is the lease TTL of the failover scenario.
const failoverTTL = time.Second

// failoverStats are the figures of one failover run.
type failoverStats struct {
	promote    time.Duration // from the fault to a new primary accepting writes
	resume     time.Duration // from the promotion to the first acknowledged append returned after it
	takeover   time.Duration // from the fault to the paused holder's lease granted anew
	held       int           // leases of the long holders held at the fault
	lost       int           // of those, the ones whose Done closed with a loss
	acked      int           // acknowledged appends
	writesLost int           // acknowledged appends missing from the final ledgers
	afterLoss  int           // appends with an older token accepted after a newer write was lost
}

func (s failoverStats) String() string {
	return fmt.Sprintf("promote=%s resume=%s takeover=%s leases_held=%d leases_lost=%d acked_writes=%d writes_lost=%d older_after_loss=%d",
		fmtDur(s.promote), fmtDur(s.resume), fmtDur(s.takeover), s.held, s.lost, s.acked, s.writesLost, s.afterLoss)
}

// Scenario 10: the primary of a streaming-replication pair crashes (immediate shutdown) under
// load and its standby is promoted, with synchronous or asynchronous replication, with and
// without lag injected by pausing the primary's WAL sender for 300 ms before the crash. Every
// client reaches the cluster through one multi-host URL (target_session_attrs=read-write), so
// it follows the promotion, as an application behind an HA setup does. The load: lease
// workers making fenced appends, advisory locks with tokens making fenced appends, a churn of
// advisory tokens (over 32 during the lag, so a lagged promotion loses sequence increments),
// and a holder paused across the failover: it took its lease on the old primary, wrote, and
// wakes after a new holder has written on the new primary.
//
// Checked: tokens never repeat and only rise per name; no append with an older token is
// accepted after a newer one that committed for good; the paused holder's late write is
// rejected as stale; Done closes by the end of each holder's trust window; with synchronous
// replication, no acknowledged write is lost and the history is linearizable. Reported: time
// to promote, to resume writes and to take the paused holder's lease over and,
// with asynchronous replication, acknowledged writes lost.
func TestScenarioFailover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc string
		sync bool
		lag  time.Duration
	}{
		{"async", false, 0},
		{"async-lag", false, 300 * time.Millisecond},
		{"sync", true, 0},
		{"sync-lag", true, 300 * time.Millisecond},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			report := &Report{Scenario: "10-failover-" + tc.desc}
			for run := range runs(1) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				s := failoverRun(t, ctx, report, pairCluster(t, ctx, tc.sync, tc.lag))
				cancel()
				t.Logf("chaos: failover scenario=%s run=%d %s", report.Scenario, run, s)
				report.AddTakeover(s.takeover)
			}
			logReport(t, report)
		})
	}
}

// Scenario 10 on the cluster users run: Patroni (etcd as its store, asynchronous replication,
// its default), one leader and one replica on loopback, under the same load and checks. The
// fault is a planned `patronictl switchover` (Patroni shuts the leader down cleanly, so
// nothing acknowledged may be lost: checked as under synchronous replication) or the leader
// killed (SIGKILL of Patroni and its postmaster), after which
// Patroni promotes the replica once the leader key expires (ttl 5 s). The paused holder's
// lessor talks to the old leader alone: after a switchover it refuses writes (ErrReadOnly),
// after a kill it is gone.
func TestScenarioPatroni(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"switchover", "kill-leader"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			report := &Report{Scenario: "10-patroni-" + mode}
			for run := range runs(1) {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				s := failoverRun(t, ctx, report, patroniCluster(t, ctx, mode))
				cancel()
				t.Logf("chaos: failover scenario=%s run=%d %s", report.Scenario, run, s)
				report.AddTakeover(s.takeover)
			}
			logReport(t, report)
		})
	}
}

// Resources of scenario 10.
const leaseName, advName, churnName, pausedName = "lease", "adv", "churn", "paused"

// heldNames are the leases of the long holders, which hold them from before the fault to the
// end of the run unless they lose them.
var heldNames = []string{"held:0", "held:1"}

// registerNames are the ledgers of scenario 10.
var registerNames = append([]string{leaseName, advName, pausedName}, heldNames...)

// failoverCluster is a replicated cluster of scenario 10, its database ready (the register
// set up and replicated), and the fault to inject.
type failoverCluster struct {
	pool   *pgxpool.Pool // the database through a multi-host URL: follows the primary
	direct *pgxpool.Pool // the database on the current primary alone, for the paused holder
	sync   bool          // synchronous replication, or a planned switchover: nothing acknowledged may be lost
	lag    time.Duration // how long replication is paused before the fault (0: not paused)
	// pause stops replication for the lag modes.
	pause func(ctx context.Context) error
	// failover injects the fault and returns once a new primary accepts writes, with the
	// wall-clock times of the fault and of the promotion.
	failover func(ctx context.Context) (fault, promoted time.Time, err error)
}

// pairCluster is a primary and a streaming standby from pgtest; the fault is the primary's
// crash (immediate shutdown) and the standby's promotion.
func pairCluster(t *testing.T, ctx context.Context, syncRep bool, lag time.Duration) *failoverCluster {
	primary := pgtest.NewServer(t, pgtest.Crashable())
	db := primary.NewDB(t)
	require.NoError(t, SetupRegister(ctx, db.Pool, registerNames...))
	standby := primary.NewStandby(t)
	if syncRep {
		require.NoError(t, primary.SetSynchronousStandbys(ctx, "*"))
	}
	url, err := pgtest.ClusterURL(db.Name, primary, standby)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=16")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &failoverCluster{
		pool: pool, direct: db.Pool, sync: syncRep, lag: lag,
		pause: func(ctx context.Context) error {
			_, err := primary.PauseWALSenders(ctx)
			return err
		},
		failover: func(ctx context.Context) (time.Time, time.Time, error) {
			fault := time.Now()
			if err := primary.Crash(ctx); err != nil {
				return fault, time.Time{}, err
			}
			crashed := time.Now()
			// The promoted server runs alone, asynchronously: the standby was made before the
			// primary set synchronous_standby_names (ALTER SYSTEM writes a file, not WAL).
			err := standby.Promote(ctx)
			promoted := time.Now()
			t.Logf("crash %v, promotion %v", crashed.Sub(fault), promoted.Sub(crashed))
			return fault, promoted, err
		},
	}
}

// patroniCluster is a two-node Patroni cluster; the fault is a switchover or the leader's
// kill.
func patroniCluster(t *testing.T, ctx context.Context, mode string) *failoverCluster {
	c := pgtest.NewPatroni(t, 2)
	db := c.NewDB(t)
	require.NoError(t, SetupRegister(ctx, db.Pool, registerNames...))
	require.NoError(t, c.WaitReplay(ctx))
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	leaderURL, err := c.NodeURL(leader, db.Name)
	require.NoError(t, err)
	direct, err := pgxpool.New(ctx, leaderURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	pool, err := pgxpool.New(ctx, db.URL+"&pool_max_conns=16")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &failoverCluster{
		// A switchover shuts the leader down cleanly: its replica has all its WAL before it is
		// promoted, so nothing acknowledged may be lost, as with synchronous replication.
		pool: pool, direct: direct, sync: mode == "switchover",
		failover: func(ctx context.Context) (time.Time, time.Time, error) {
			var change pgtest.LeaderChange
			var err error
			fault := time.Now()
			if mode == "switchover" {
				change, err = c.Switchover(ctx, "")
			} else {
				change, err = c.KillLeader(ctx)
			}
			t.Logf("patroni %s: %s -> %s, timeline %d, %v", mode, change.From, change.To, change.Timeline, change.Elapsed)
			return fault, fault.Add(change.Elapsed), err
		},
	}
}

// failoverRun runs one failover of fc under load and checks its history.
func failoverRun(t *testing.T, ctx context.Context, report *Report, fc *failoverCluster) failoverStats {
	pool := fc.pool
	rec := newRecorder(t, ctx, pool)
	backoff := fencelock.WithBackoff(fencelock.ExponentialBackoff(time.Millisecond, 50*time.Millisecond))

	var watchers sync.WaitGroup
	defer watchers.Wait()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := range 3 {
		w := &leaseWorker{rec: rec, pool: pool, worker: fmt.Sprintf("w%d", i), name: leaseName, ttl: failoverTTL, writes: 30, gap: 10 * time.Millisecond, opts: []fencelock.LessorOption{backoff}}
		wg.Go(func() { w.run(wctx) })
	}
	wg.Go(func() { advisoryAppender(t, wctx, rec, pool, "adv", advName) })
	wg.Go(func() { tokenChurn(t, wctx, rec, pool, "churn", churnName) })
	for i, name := range heldNames {
		wg.Go(func() { longHolder(wctx, rec, pool, fmt.Sprintf("hold%d", i), name, &watchers) })
	}
	time.Sleep(jitter(300*time.Millisecond, 500*time.Millisecond))

	// The paused holder takes its lease just before the crash, through a pool of the old
	// primary alone, so that it renews nothing once the primary is gone, as a paused process
	// would not; it writes once, and writes again (through the cluster URL) when it wakes.
	// With asynchronous replication and lag, it takes the lease after the WAL sender paused,
	// so the promotion loses its grant, as the measurement had it; with synchronous
	// replication a grant would wait for the paused sender, so it takes the lease first.
	pause := func() {
		if fc.lag > 0 {
			require.NoError(t, fc.pause(ctx))
			rec.Record(Op{Kind: KindFault, Value: "pause-replication"})
		}
	}
	if !fc.sync {
		pause()
	}
	sleeper, err := fencelock.NewLessor(fc.direct, fencelock.WithHolder("paused"))
	require.NoError(t, err)
	held, ok := acquireRecorded(ctx, rec, sleeper, "paused", pausedName, failoverTTL)
	require.True(t, ok, "the paused holder's grant")
	sleeperWorker := &leaseWorker{rec: rec, worker: "paused"}
	watchers.Go(func() { sleeperWorker.watch(held) })
	sleeperApp := &Appender{Pool: pool, Rec: rec, Worker: "paused", Holder: "paused"}
	require.True(t, checkHeld(rec, "paused", held))
	require.NoError(t, sleeperApp.Append(ctx, pausedName, held.Token()))
	// The taker contends for the paused holder's lease from now on: it cannot have it before
	// the crash, since the paused holder renews it until then.
	taker := &leaseWorker{rec: rec, pool: pool, worker: "taker", name: pausedName, ttl: failoverTTL, writes: 4, gap: 10 * time.Millisecond, opts: []fencelock.LessorOption{backoff}}
	wg.Go(func() { taker.run(wctx) })
	if fc.sync {
		pause()
	}
	time.Sleep(fc.lag)

	fault, promotedAt, err := fc.failover(ctx)
	require.NoError(t, err)
	crashed, promoted := rec.Since(fault), rec.Since(promotedAt)
	rec.Record(Op{Kind: KindFault, Value: "failover", Invoke: crashed, Return: promoted})

	// The paused holder wakes once the taker has written on the new primary, and writes with
	// its old token.
	takerEntries := func(entries []string) int {
		n := 0
		for _, e := range entries {
			if strings.HasPrefix(e, "(taker,") {
				n++
			}
		}
		return n
	}
	base := -1
	require.NoError(t, awaitLedger(ctx, pool, pausedName, func(entries []string) bool {
		if base < 0 {
			base = takerEntries(entries)
			return false
		}
		return takerEntries(entries) > base
	}), "no new holder wrote on the new primary")
	lateErr := sleeperApp.Append(ctx, pausedName, held.Token())
	releaseRecorded(rec, "paused", held)

	time.Sleep(2 * failoverTTL) // load on the new primary, and every old trust window ends
	stop()
	wg.Wait()
	watchers.Wait()

	fences := map[string]int64{}
	for _, name := range registerNames {
		_, err := ReadLedger(ctx, pool, rec, "checker", name)
		require.NoError(t, err)
		fences[name], err = FenceOf(ctx, pool, name)
		require.NoError(t, err)
	}
	h := rec.History()
	vs := CheckFailover(h, fences, doneSlack, checkTimeout, fc.sync)
	for i, v := range vs {
		if i == 20 {
			t.Errorf("... and %d more violations", len(vs)-i)
			break
		}
		t.Errorf("violation: %v", v)
	}
	report.AddRun(h, vs)
	report.AddDetect(doneDetect(h)...)
	require.ErrorIs(t, lateErr, fencelock.ErrStaleToken, "the holder paused across the failover wrote with its old token")

	s := failoverStats{promote: promoted - crashed, resume: -1, takeover: -1}
	_, s.afterLoss = OlderTokenAccepts(h)
	s.held, s.lost = longHoldersLost(h, crashed)
	s.writesLost = LostWrites(h)
	for _, op := range h {
		switch {
		case op.Kind == KindAppend && op.Outcome == OK:
			s.acked++
			if op.Return >= promoted && (s.resume < 0 || op.Return-promoted < s.resume) {
				s.resume = op.Return - promoted
			}
		case op.Kind == KindGrant && op.Outcome == OK && op.Worker == "taker" && op.Return >= crashed:
			if s.takeover < 0 || op.Return-crashed < s.takeover {
				s.takeover = op.Return - crashed
			}
		}
	}
	return s
}

// longHolder takes lease name once and holds it, making a fenced append every 50 ms while its
// own check finds it held, until ctx ends (then it releases it) or it loses the lease.
func longHolder(ctx context.Context, rec *Recorder, pool *pgxpool.Pool, worker, name string, watchers *sync.WaitGroup) {
	l, err := fencelock.NewLessor(pool, fencelock.WithHolder(worker))
	if err != nil {
		panic(err)
	}
	lease, ok := acquireRecorded(ctx, rec, l, worker, name, failoverTTL)
	if !ok {
		return
	}
	w := &leaseWorker{rec: rec, worker: worker}
	watchers.Go(func() { w.watch(lease) })
	app := &Appender{Pool: pool, Rec: rec, Worker: worker, Holder: worker}
	for ctx.Err() == nil && checkHeld(rec, worker, lease) {
		_ = app.Append(ctx, name, lease.Token())
		sleepCtx(ctx, 50*time.Millisecond)
	}
	releaseRecorded(rec, worker, lease)
}

// longHoldersLost counts the long holders' leases granted before time crashed, and of those
// the ones whose Done closed with a loss (anything but a release).
func longHoldersLost(h History, crashed time.Duration) (held, lost int) {
	done := map[int64]string{}
	for _, op := range h {
		if op.Kind == KindDone && strings.HasPrefix(op.Worker, "hold") {
			done[op.Token] = op.Err
		}
	}
	for _, op := range h {
		if op.Kind == KindGrant && op.Outcome == OK && strings.HasPrefix(op.Worker, "hold") && op.Return < crashed {
			held++
			if e, ok := done[op.Token]; ok && e != fencelock.ErrReleased.Error() {
				lost++
			}
		}
	}
	return held, lost
}

// awaitLedger polls the ledger of resource until ok(entries) or ctx ends (at most 30 s).
func awaitLedger(ctx context.Context, pool *pgxpool.Pool, resource string, ok func([]string) bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var entries []string
		err := pool.QueryRow(ctx, `SELECT entries FROM ledger WHERE resource = $1`, resource).Scan(&entries)
		if err == nil && ok(entries) {
			return nil
		}
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), err)
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// advisoryAppender takes the session advisory lock name with a fencing token in a loop and
// makes three fenced appends to the ledger of name while the lock is held.
func advisoryAppender(t *testing.T, ctx context.Context, rec *Recorder, pool *pgxpool.Pool, worker, name string) {
	locker, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens(), fencelock.WithWatchdogInterval(100*time.Millisecond))
	if err != nil {
		t.Error(err)
		return
	}
	app := &Appender{Pool: pool, Rec: rec, Worker: worker, Holder: worker}
	for ctx.Err() == nil {
		lk, ok := tryLockRecorded(ctx, rec, locker, worker, name)
		if !ok {
			sleepCtx(ctx, 5*time.Millisecond)
			continue
		}
		for range 3 {
			if lk.Err() != nil {
				break
			}
			_ = app.Append(ctx, name, lk.Token())
			sleepCtx(ctx, 5*time.Millisecond)
		}
		unlockRecorded(rec, worker, lk)
	}
}

// tokenChurn takes and releases the session advisory lock name with a fencing token as fast
// as it can, recording each grant: it draws sequence values, hundreds a second.
func tokenChurn(t *testing.T, ctx context.Context, rec *Recorder, pool *pgxpool.Pool, worker, name string) {
	locker, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
	if err != nil {
		t.Error(err)
		return
	}
	for ctx.Err() == nil {
		lk, ok := tryLockRecorded(ctx, rec, locker, worker, name)
		if !ok {
			sleepCtx(ctx, 5*time.Millisecond)
			continue
		}
		unlockRecorded(rec, worker, lk)
	}
}

// tryLockRecorded runs AdvisoryLocker.TryLock and records it as a grant. An error is recorded
// as a failed grant: TryLock returns no lock, and none is held (a broken session holds
// nothing).
func tryLockRecorded(ctx context.Context, rec *Recorder, locker *fencelock.AdvisoryLocker, worker, name string) (*fencelock.AdvisoryLock, bool) {
	id := rec.Invoke(Op{Worker: worker, Kind: KindGrant, Name: name, Holder: worker})
	lk, err := locker.TryLock(ctx, name)
	if err != nil {
		rec.Complete(id, Fail, err, nil)
		return nil, false
	}
	rec.Complete(id, OK, nil, func(op *Op) { op.Token = int64(lk.Token()) })
	return lk, true
}

// unlockRecorded records lk's loss (as a Done closing) if it had been lost already, then
// unlocks it with a fresh context and records the release.
func unlockRecorded(rec *Recorder, worker string, lk *fencelock.AdvisoryLock) {
	if err := lk.Err(); err != nil {
		now := rec.Now()
		rec.Record(Op{Worker: worker, Kind: KindDone, Name: lk.Name(), Token: int64(lk.Token()), Err: err.Error(), Invoke: now, Return: now})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id := rec.Invoke(Op{Worker: worker, Kind: KindRelease, Name: lk.Name(), Token: int64(lk.Token())})
	err := lk.Unlock(ctx)
	rec.Complete(id, Classify(err), err, nil)
}
