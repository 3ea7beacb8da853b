package job_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/job"
)

// newJob returns job name on a lessor of its own with holder id holder.
func newJob(t *testing.T, b *bundle, holder, name string, ttl time.Duration, lopts []fencelock.LessorOption, opts ...job.Option) *job.Job {
	t.Helper()
	j, err := job.New(newLessor(t, b.Pool, holder, lopts...), name, ttl, opts...)
	require.NoError(t, err)
	return j
}

// ledger reads a slot's outcome and attempt from fencelock.job_ledger.
func ledger(t *testing.T, b *bundle, name string, slot time.Time) (outcome string, attempt int) {
	t.Helper()
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT outcome, attempt FROM fencelock.job_ledger WHERE job = $1 AND slot = $2`, name, slot).Scan(&outcome, &attempt))
	return outcome, attempt
}

// A slot runs once across replicas, whether they come one after the other or at once (skip:
// the others find the lease busy or the slot done; wait: they find the slot done); the ledger
// reads succeeded.
func TestJobRunSlotOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		opts []job.Option
	}{{"Skip", nil}, {"Wait", []job.Option{job.WithOverlapWait()}}} {
		t.Run(tc.name, func(t *testing.T) {
			name := "job:once:" + tc.name
			var runs atomic.Int32
			fn := func(ctx context.Context, run *job.Run) error {
				runs.Add(1)
				require.Equal(t, 1, run.Attempt)
				time.Sleep(50 * time.Millisecond) // the job's work, long enough for the others to overlap
				return nil
			}
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range 4 {
				j := newJob(t, b, "replica-"+tc.name+string(rune('a'+i)), name, 5*time.Second, nil, tc.opts...)
				wg.Go(func() { errs[i] = j.RunSlot(b.Ctx, slot, fn) })
			}
			wg.Wait()
			require.EqualValues(t, 1, runs.Load())
			ok := 0
			for _, err := range errs {
				switch {
				case err == nil:
					ok++
				case errors.Is(err, job.ErrSlotDone), errors.Is(err, job.ErrSlotBusy):
				default:
					t.Fatalf("unexpected error: %v", err)
				}
			}
			require.Equal(t, 1, ok)
			later := newJob(t, b, "later-"+tc.name, name, 5*time.Second, nil, tc.opts...)
			require.ErrorIs(t, later.RunSlot(b.Ctx, slot, fn), job.ErrSlotDone, "a restart runs no slot twice")
			outcome, attempt := ledger(t, b, name, slot)
			require.Equal(t, "succeeded", outcome)
			require.Equal(t, 1, attempt)
		})
	}
}

// A failed run is recorded as failed and not run again, unless the job retries failed runs;
// a run that loses its lease midway is recorded as crashed, and run again only by a job that
// retries crashed runs (attempt 2, with a larger token).
func TestJobRetryPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)
	boom := errors.New("boom")

	j := newJob(t, b, "fail-1", "job:fail", 5*time.Second, nil)
	require.Equal(t, boom, j.RunSlot(b.Ctx, slot, func(context.Context, *job.Run) error { return boom }))
	outcome, _ := ledger(t, b, "job:fail", slot)
	require.Equal(t, "failed", outcome)
	require.ErrorIs(t, j.RunSlot(b.Ctx, slot, func(context.Context, *job.Run) error { return nil }), job.ErrSlotDone)
	retry := newJob(t, b, "fail-2", "job:fail", 5*time.Second, nil, job.WithRetryFailed())
	require.NoError(t, retry.RunSlot(b.Ctx, slot, func(_ context.Context, run *job.Run) error {
		require.Equal(t, 2, run.Attempt)
		return nil
	}))
	outcome, attempt := ledger(t, b, "job:fail", slot)
	require.Equal(t, "succeeded", outcome)
	require.Equal(t, 2, attempt)

	// A run whose lease is lost (no heartbeat, TTL 1 s): its context ends; it records nothing.
	crashing := newJob(t, b, "crash-1", "job:crash", time.Second, []fencelock.LessorOption{fencelock.WithoutHeartbeat()})
	var first fencelock.Token
	err := crashing.RunSlot(b.Ctx, slot, func(ctx context.Context, run *job.Run) error {
		first = run.Lease.Token()
		<-ctx.Done()
		return nil
	})
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	outcome, _ = ledger(t, b, "job:crash", slot)
	require.Equal(t, "crashed", outcome)
	noRetry := newJob(t, b, "crash-2", "job:crash", 5*time.Second, nil)
	require.ErrorIs(t, noRetry.RunSlot(b.Ctx, slot, func(context.Context, *job.Run) error { return nil }), job.ErrSlotDone,
		"a crashed slot is not run again by default")
	again := newJob(t, b, "crash-3", "job:crash", 5*time.Second, nil, job.WithRetryCrashed())
	require.NoError(t, again.RunSlot(b.Ctx, slot, func(_ context.Context, run *job.Run) error {
		require.Equal(t, 2, run.Attempt)
		require.Greater(t, run.Lease.Token(), first)
		return nil
	}))
	outcome, attempt = ledger(t, b, "job:crash", slot)
	require.Equal(t, "succeeded", outcome)
	require.Equal(t, 2, attempt)
}

// Every: three replicas, slots of 200 ms on the database clock; each slot that starts while
// they run is run exactly once, by one of them; WithHoldAtLeast keeps the lease for the hold.
//
// The replicas run until six slots have run (about a second on an idle machine), under a
// deadline of 30 s for a loaded one: a slow machine makes the test longer, not its slots fewer.
// That no slot was left out is checked by the slots run being consecutive on the grid.
func TestJobEvery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const every = 200 * time.Millisecond
	const want = 6
	first := gridSlot(t, b, every) // a first deployment runs no past slot
	ctx, cancel := context.WithCancel(b.Ctx)
	var mu sync.Mutex
	runs := map[time.Time]int{}
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, also when the deadline fails the test
	defer cancel()
	for i := range 3 {
		j := newJob(t, b, "every-"+string(rune('a'+i)), "job:every", 5*time.Second, nil, job.WithHoldAtLeast(50*time.Millisecond))
		wg.Go(func() {
			err := j.Every(ctx, every, func(_ context.Context, run *job.Run) error {
				mu.Lock()
				runs[run.Slot]++
				mu.Unlock()
				return nil
			}, func(slot time.Time, err error) { t.Errorf("slot %v: %v", slot, err) })
			require.ErrorIs(t, err, context.Canceled)
		})
	}
	start := time.Now()
	deadline := time.After(30 * time.Second)
	for {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n >= want {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("%d slots of 200 ms run in 30 s, want %d", n, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d slots run in %v", len(runs), time.Since(start).Round(time.Millisecond))
	slots := slices.Collect(maps.Keys(runs))
	for slot, n := range runs {
		require.Equal(t, 1, n, "slot %v ran %d times", slot, n)
		require.False(t, slot.Before(first), "slot %v is before the replicas started (%v)", slot, first)
		require.True(t, slot.Equal(slot.Truncate(every)), "slot %v is not on the 200 ms grid", slot)
	}
	lo, hi := slices.MinFunc(slots, time.Time.Compare), slices.MaxFunc(slots, time.Time.Compare)
	require.Equal(t, int(hi.Sub(lo)/every)+1, len(runs), "a slot between %v and %v was not run", lo, hi)
	var ledgerRows int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.job_ledger WHERE job = 'job:every' AND outcome = 'succeeded'`).Scan(&ledgerRows))
	require.Equal(t, len(runs), ledgerRows)
}

// Bad input is refused before any SQL.
func TestJobBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "job-bad")
	_, err := job.New(nil, "x", time.Second)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	_, err = job.New(l, "x", time.Second, job.WithHoldAtLeast(-time.Second))
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	j, err := job.New(l, "x", time.Second)
	require.NoError(t, err)
	require.ErrorIs(t, j.RunSlot(b.Ctx, time.Now(), nil), fencelock.ErrInvalidArgument)
	require.ErrorIs(t, j.Every(b.Ctx, 0, func(context.Context, *job.Run) error { return nil }, nil), fencelock.ErrInvalidArgument)
}

// A run whose lease is lost reads crashed whatever fn returns (ctx's error, as usual, or nil),
// and so does one cut short by its caller (a replica shutting down): neither is a failure, and
// WithRetryCrashed runs the slot again.
func TestJobInterruptedRunsReadCrashed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	lost := newJob(t, b, "lost", "job:lost", 2*time.Second, []fencelock.LessorOption{fencelock.WithoutHeartbeat()})
	// A grant whose reply came after its trust window (a loaded machine) is refused and
	// claims nothing: the run reads busy, and is asked again.
	var err error
	for range 10 {
		err = lost.RunSlot(b.Ctx, slot, func(ctx context.Context, _ *job.Run) error {
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.Is(err, job.ErrSlotBusy) {
			break
		}
		t.Logf("RunSlot: %v; again", err)
	}
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	outcome, _ := ledger(t, b, "job:lost", slot)
	require.Equal(t, "crashed", outcome)
	retry := newJob(t, b, "lost-retry", "job:lost", 5*time.Second, nil, job.WithRetryCrashed())
	require.NoError(t, retry.RunSlot(b.Ctx, slot, func(context.Context, *job.Run) error { return nil }))

	ctx, cancel := context.WithCancel(b.Ctx)
	shut := newJob(t, b, "shut", "job:shut", 5*time.Second, nil)
	err = shut.RunSlot(ctx, slot, func(ctx context.Context, _ *job.Run) error {
		cancel() // the replica shuts down mid-run
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	outcome, _ = ledger(t, b, "job:shut", slot)
	require.Equal(t, "crashed", outcome, "a run cut short by its caller is not a failure")
}

// WithHoldAtLeast holds the job's lease after a run, not when the slot was done already; a period
// that is not a whole number of microseconds is refused.
func TestJobHoldAtLeast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 13, 0, 0, 0, time.UTC)
	const hold = 400 * time.Millisecond
	j := newJob(t, b, "hold", "job:hold", 5*time.Second, nil, job.WithHoldAtLeast(hold))
	start := time.Now()
	require.NoError(t, j.RunSlot(b.Ctx, slot, func(context.Context, *job.Run) error { return nil }))
	require.GreaterOrEqual(t, time.Since(start), hold, "returned before the hold")
	// A replica with a hold of a minute finds the slot done and returns without holding. The
	// bound is the hold, not a latency budget: a minute is far above one ledger read even on a
	// loaded machine (400 ms need not be), so only holding the lease breaks it.
	const longHold = time.Minute
	late := newJob(t, b, "hold-late", "job:hold", 5*time.Second, nil, job.WithHoldAtLeast(longHold))
	start = time.Now()
	require.ErrorIs(t, late.RunSlot(b.Ctx, slot, func(context.Context, *job.Run) error { return nil }), job.ErrSlotDone)
	require.Less(t, time.Since(start), longHold, "held the lease for a slot that was done")
	require.ErrorIs(t, j.Every(b.Ctx, time.Second/3, func(context.Context, *job.Run) error { return nil }, nil), fencelock.ErrInvalidArgument)
}

// Slots that stay unclaimed past their horizon (the job's lease held by someone who never
// releases it) are given up and recorded as missed; the slots after the lease frees run.
func TestJobEveryGivesUpPastHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const every = 100 * time.Millisecond
	const ttl = 300 * time.Millisecond // horizon: 400 ms
	blocker, err := newLessor(t, b.Pool, "blocker").TryAcquire(b.Ctx, "job:horizon", 5*time.Second)
	require.NoError(t, err)
	j := newJob(t, b, "every-h", "job:horizon", ttl, nil)
	ctx, cancel := context.WithCancel(b.Ctx)
	done := make(chan error, 1)
	var ran atomic.Int32
	go func() {
		done <- j.Every(ctx, every, func(context.Context, *job.Run) error { ran.Add(1); return nil }, nil)
	}()
	waitFor(t, b, "slots given up while the lease is held", func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.job_ledger WHERE job = 'job:horizon' AND outcome = 'missed'`).Scan(&n))
		return n >= 3
	})
	require.Zero(t, ran.Load(), "ran while the lease was held")
	require.NoError(t, blocker.Release(b.Ctx))
	waitFor(t, b, "slots run once the lease is free", func() bool { return ran.Load() >= 2 })
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	var dup int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) - count(DISTINCT slot) FROM fencelock.job_runs WHERE job = 'job:horizon'`).Scan(&dup))
	require.Zero(t, dup)
}

// gridSlot returns the slot of period every that the database clock is in, as Every names it.
func gridSlot(t *testing.T, b *bundle, every time.Duration) time.Time {
	t.Helper()
	var slot time.Time
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT 'epoch'::timestamptz + (floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint / $1 * $1) * interval '1 microsecond'`,
		every.Microseconds()).Scan(&slot))
	return slot
}

// A replica that starts after a slot off the grid was run (RunSlot of another instant) rounds
// up onto the grid: no period runs twice.
func TestJobEveryStartsOnTheGrid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const every = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(b.Ctx)
	defer cancel()
	var wg sync.WaitGroup
	run := func(holder string) {
		j := newJob(t, b, holder, "job:grid", 5*time.Second, nil)
		wg.Go(func() { _ = j.Every(ctx, every, func(context.Context, *job.Run) error { return nil }, nil) })
	}
	run("grid-a")
	off := newJob(t, b, "grid-off", "job:grid", 5*time.Second, nil, job.WithOverlapWait()) // grid-a may hold the lease
	require.NoError(t, off.RunSlot(b.Ctx, gridSlot(t, b, every).Add(37*time.Millisecond), func(context.Context, *job.Run) error { return nil }))
	run("grid-b")
	time.Sleep(800 * time.Millisecond) // eight periods of both replicas
	cancel()
	wg.Wait()
	var twice int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM (
		SELECT floor(extract(epoch FROM slot) * 10) AS period FROM fencelock.job_runs WHERE job = 'job:grid' AND token > 0
		GROUP BY 1 HAVING count(*) > 1) AS p`).Scan(&twice))
	require.LessOrEqual(t, twice, 1, "periods run twice (one may be the off-grid RunSlot's own period)")
}

// A replica that starts after another crashed mid-run runs the crashed slot again when the job
// retries crashed runs.
func TestJobEveryRetriesCrashedSlotOnStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const every = 500 * time.Millisecond
	slot := gridSlot(t, b, every)
	dead := newJob(t, b, "crashing", "job:restart", time.Second, []fencelock.LessorOption{fencelock.WithoutHeartbeat()}, job.WithRetryCrashed())
	err := dead.RunSlot(b.Ctx, slot, func(ctx context.Context, _ *job.Run) error { <-ctx.Done(); return ctx.Err() })
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	outcome, _ := ledger(t, b, "job:restart", slot)
	require.Equal(t, "crashed", outcome)

	ctx, cancel := context.WithCancel(b.Ctx)
	defer cancel()
	// TTL 10 s: the horizon (TTL plus a period) covers the crashed slot however late the
	// replacement starts (with 1 s, the slot was 0.9-1.4 s old already: little room left).
	replacement := newJob(t, b, "replacement", "job:restart", 10*time.Second, nil, job.WithRetryCrashed())
	retried := make(chan int, 1)
	go func() {
		_ = replacement.Every(ctx, every, func(_ context.Context, run *job.Run) error {
			if run.Slot.Equal(slot) {
				retried <- run.Attempt
			}
			return nil
		}, nil)
	}()
	select {
	case attempt := <-retried:
		require.Equal(t, 2, attempt)
	case <-time.After(15 * time.Second):
		t.Fatal("the crashed slot was not run again by the replica that started after the crash")
	}
}
