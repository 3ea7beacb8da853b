package fencelock_test

// Issue 30: no grant attempt of a semaphore waits for another's lock. Two waits were left by
// migration 00012, both of one attempt behind another's transaction: the count after a lowered
// limit (the semaphore's row FOR NO KEY UPDATE) and the creation of a semaphore's row by its
// first acquires (INSERT ... ON CONFLICT meeting an insert in progress). Migration 00015 makes
// such an attempt busy instead (refused, ahead -1: look again at once). Migration 00016 removes
// two rarer waits that the sampled tests below caught in 1-2 of 8 runs (log_lock_waits named
// them): a first acquire's insert meeting the row committed meanwhile and being updated by a
// reclaiming grant, and FOR NO KEY UPDATE SKIP LOCKED waiting while it follows the row's
// update chain.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// lwRequireBusy runs a try ("t", wait id tryID) and a wait ("w", wait id waitID) of semaphore
// sem, each checked by lwAttempt for a wait on another transaction, and requires both to be
// refused as busy: told to look again at once (ahead -1) rather than waiting for a lock.
func lwRequireBusy(t *testing.T, b *bundle, sem string, tryID, waitID int64) {
	t.Helper()
	for _, a := range []rvAttempt{
		lwAttempt(t, b, sem, "t", tryID, false),
		lwAttempt(t, b, sem, "w", waitID, true),
	} {
		require.EqualValues(t, 4, a.outcome)
		require.EqualValues(t, -1, a.ahead, "busy: look again at once")
	}
}

// lwAttempt runs fencelock.semaphore_acquire on its own connection of b's pool and returns its
// row, or fails the test when the server shows it waiting for another transaction (a lock
// wait on a transaction id, a tuple or an advisory lock: the transactions these tests hold
// open stay open, so such a wait lasts until the test looks), looked for every 5 ms while it
// runs. Not by a time the machine must beat: a loaded machine may take seconds to run it, and
// no wait of it is on a lock. A minute without an answer fails as a hang.
func lwAttempt(t *testing.T, b *bundle, sem, who string, wait int64, queue bool) rvAttempt {
	t.Helper()
	type result struct {
		a   rvAttempt
		err error
	}
	start := time.Now()
	r := noLockWait(t, b, fmt.Sprintf("%s's attempt (queue %v)", who, queue), time.Minute, func() result {
		a, err := rvAcquireErr(b.Ctx, b.Pool, sem, who, wait, time.Minute, queue, "")
		return result{a, err}
	})
	require.NoError(t, r.err)
	t.Logf("%s's attempt (queue %v) returned in %v: outcome %d, ahead %d", who, queue, time.Since(start).Round(time.Microsecond), r.a.outcome, r.a.ahead)
	return r.a
}

// noLockWait runs f on a goroutine of its own and returns what it returned. It fails the test
// when the server shows a semaphore_acquire of this database waiting meanwhile for a lock
// another transaction holds (on a transaction id, a tuple or an advisory lock), looked for
// every 5 ms, or when f has not returned after hang (a bound for hangs, not for the machine's
// speed). what names f in the messages. f must not fail the test itself (it runs on another
// goroutine): it returns its error in T.
func noLockWait[T any](t *testing.T, b *bundle, what string, hang time.Duration, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	start := time.Now()
	go func() { done <- f() }()
	timeout := time.After(hang)
	look := time.NewTicker(5 * time.Millisecond)
	defer look.Stop()
	for {
		select {
		case r := <-done:
			return r
		case <-timeout:
			t.Fatalf("%s has not returned after %v", what, hang)
		case <-look.C:
			var ev string
			require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT coalesce(string_agg(wait_event_type || '/' || wait_event, ','), '') FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'active' AND query LIKE '%semaphore_acquire%' AND pid <> pg_backend_pid()
				  AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple', 'advisory')`).Scan(&ev))
			if ev != "" {
				t.Fatalf("%s waits behind another transaction (%s), %v after it began", what, ev, time.Since(start))
			}
		}
	}
}

// After SetLimit lowered the limit (a permit above it held: grants count), an attempt that
// arrives while another attempt's transaction counts and holds the semaphore's row does not
// wait for that transaction: a try and a wait are both told to look again at once (ahead -1),
// and change nothing; once the counting transaction has committed, the next attempt decides
// (here: refused, the room taken, and the wait queued at the head). Before migration 00015
// both waited until the counting transaction ended.
func TestSemaphoreCountingAttemptWaitsForNoOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	ps := rvFill(t, ctx, b.Pool, "lwc", 3)
	require.Equal(t, "lwc#2", ps[2].name)
	rvExec(t, ctx, b.Pool, `SELECT fencelock.semaphore_set_limit('lwc', 2)`) // lwc#2 held above it: counting
	for i := range 2 {
		require.EqualValues(t, 1, rvInt(t, ctx, b.Pool, `SELECT fencelock.semaphore_release('lwc', $1, $2, $3)`, ps[i].name, fmt.Sprint("h", i), ps[i].token))
	}
	// 1 of 2 held: a counting grant, its transaction left open (as a slow commit would).
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	g := rvAcquire(t, ctx, tx, "lwc", "g", 10, time.Minute, false, "")
	require.EqualValues(t, 1, g.outcome, "the counting grant")

	lwRequireBusy(t, b, "lwc", 11, 12)
	require.EqualValues(t, 0, rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_waiters WHERE semaphore = 'lwc'`),
		"a busy attempt changes nothing: the wait takes no place")

	require.NoError(t, tx.Commit(ctx))
	w := lwAttempt(t, b, "lwc", "w", 12, true)
	require.EqualValues(t, 4, w.outcome, "2 of 2 held: refused")
	require.EqualValues(t, 0, w.ahead, "decided: at the head")
	require.EqualValues(t, 2, rvInt(t, ctx, b.Pool, `SELECT held FROM fencelock.semaphore_state WHERE name = 'lwc'`))
}

// The first acquires of a semaphore that has no row: while one attempt's transaction creates
// the row (and is granted a permit), a try and a wait of another do not wait for its insert:
// both are told to look again at once (ahead -1), and change nothing.
// SetLimit, an operator's statement, waits for the creation instead. Once the creating
// transaction has committed, the next attempts decide. Before migration 00015 both attempts
// waited until the creating transaction ended.
func TestSemaphoreFirstAcquireWaitsForNoOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var first int32
	require.NoError(t, tx.QueryRow(ctx, `SELECT outcome FROM fencelock.semaphore_acquire('lwf', 'c', 1, $1, 2, false, '', $2)`,
		time.Minute.Microseconds(), (5*time.Second).Microseconds()).Scan(&first))
	require.EqualValues(t, 1, first, "the creating grant")

	lwRequireBusy(t, b, "lwf", 2, 3)
	require.EqualValues(t, 0, rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphores WHERE name = 'lwf'`)+
		rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_waiters WHERE semaphore = 'lwf'`), "a busy attempt changes nothing")

	setLimit := make(chan error, 1)
	go func() {
		_, err := b.Pool.Exec(ctx, `SELECT fencelock.semaphore_set_limit('lwf', 3)`)
		setLimit <- err
	}()
	rvWaitLocked(t, b, "semaphore_set_limit", 3*time.Second) // waits for the creation (the creation key)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-setLimit)
	require.EqualValues(t, 3, rvInt(t, ctx, b.Pool, `SELECT permit_limit FROM fencelock.semaphores WHERE name = 'lwf'`))
	require.EqualValues(t, 2, rvInt(t, ctx, b.Pool, `SELECT count(*) FROM fencelock.semaphore_free WHERE semaphore = 'lwf'`), "slots 1 and 2 free")

	w := lwAttempt(t, b, "lwf", "w", 3, true)
	require.EqualValues(t, 1, w.outcome, "the wait at the head, 1 of 3 held: granted")
	require.Equal(t, "lwf#1", w.name)
	try := lwAttempt(t, b, "lwf", "t", 2, false)
	require.EqualValues(t, 1, try.outcome, "2 of 3 held, nobody waiting: granted")
}

// A first acquire that did not see the semaphore's row, and took the creation key once the
// creator had committed, looks for the row again rather than inserting it: its insert would
// meet the committed row, and INSERT ... ON CONFLICT DO NOTHING waits for any transaction
// updating that row (here an open UPDATE of next_reclaim, as a reclaiming grant makes). The
// attempt is held between its first look and the key by a gate: this test's database gets a
// creation key function that, in the attempt's session alone, first takes a shared advisory
// lock the test holds. Migration 00016 added the second look; before it, the attempt was seen
// blocked by the updating transaction ("while inserting index tuple", log_lock_waits).
func TestSemaphoreFirstAcquireAfterCreationCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	const gate = 160016
	rvExec(t, ctx, b.Pool, fmt.Sprintf(`CREATE OR REPLACE FUNCTION fencelock.semaphore_creation_key(sem text) RETURNS bigint
		LANGUAGE plpgsql VOLATILE AS $$
		BEGIN
			IF pg_catalog.current_setting('fltest.gate', true) = 'on' THEN
				PERFORM pg_catalog.pg_advisory_xact_lock_shared(%d);
			END IF;
			RETURN pg_catalog.hashtextextended('fencelock.semaphores ' || sem, 0);
		END $$`, gate))
	begin := func() pgx.Tx {
		tx, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		return tx
	}
	gateTx := begin()
	rvExec(t, ctx, gateTx, `SELECT pg_advisory_xact_lock($1)`, gate)
	creator := begin()
	rvExec(t, ctx, creator, `SELECT fencelock.semaphore_set_limit('lwc', 2)`)

	conn, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	rvExec(t, ctx, conn, `SET fltest.gate = 'on'`)
	attemptPid := rvInt(t, ctx, conn, `SELECT pg_backend_pid()`)
	type result struct {
		a   rvAttempt
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := rvAcquireErr(ctx, conn, "lwc", "a", 1, time.Minute, false, "")
		done <- result{a, err}
	}()
	var r result
	returned := false
	var updater pgx.Tx
	defer func() { // on a failure: end what holds the attempt, and await it before conn.Release
		if !returned {
			for _, tx := range []pgx.Tx{gateTx, updater} {
				if tx != nil {
					_ = tx.Rollback(ctx)
				}
			}
			<-done
		}
	}()
	// The attempt reaches the gate (it saw no row: the creation is not committed).
	rvWaitLocked(t, b, "semaphore_acquire", 30*time.Second)

	require.NoError(t, creator.Commit(ctx))
	updater = begin()
	rvExec(t, ctx, updater, `UPDATE fencelock.semaphores SET next_reclaim = next_reclaim WHERE name = 'lwc'`)
	updaterPid := rvInt(t, ctx, updater, `SELECT pg_backend_pid()`)
	require.NoError(t, gateTx.Rollback(ctx))

	// Until the attempt returns, or is seen blocked by the update (the defect).
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for got := false; !got; {
		select {
		case r = <-done:
			got, returned = true, true
		case <-ctx.Done():
			t.Fatal("the attempt neither returned nor waited for the update")
		case <-tick.C:
			if rvInt(t, ctx, b.Pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND $2 = ANY (pg_blocking_pids(pid))`, attemptPid, updaterPid) > 0 {
				t.Fatal("the first acquire waits for the transaction updating the semaphore's row")
			}
		}
	}
	require.NoError(t, r.err)
	require.EqualValues(t, 1, r.a.outcome, "granted, the update still open")
	require.Equal(t, "lwc#0", r.a.name)
	require.NoError(t, updater.Rollback(ctx))
}

// TryAcquire on a semaphore whose row another transaction is creating does not answer
// ErrNotAcquired for a permit that is free: it tries again until the creation has committed,
// then gets its permit; and gives up with ErrNotAcquired after about a second of busy answers,
// saying so.
// No backend of the test's database waits for a lock meanwhile but SetLimit's.
func TestSemaphoreTryAcquireWhileCreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	create := func(sem string) pgx.Tx {
		tx, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		var outcome int32
		require.NoError(t, tx.QueryRow(ctx, `SELECT outcome FROM fencelock.semaphore_acquire($1, 'c', 1, $2, 2, false, '', $3)`,
			sem, time.Minute.Microseconds(), (5*time.Second).Microseconds()).Scan(&outcome))
		require.EqualValues(t, 1, outcome)
		return tx
	}
	lockWaits := func() int64 {
		return rvInt(t, ctx, b.Pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
	}

	t.Run("GrantedOnceCreated", func(t *testing.T) {
		tx := create("lwt")
		s := newSemaphore(t, b, "lwt-l", "lwt", 2)
		type result struct {
			p   *fencelock.Lease
			err error
		}
		got := make(chan result, 1)
		go func() {
			p, err := s.TryAcquire(ctx, time.Minute)
			got <- result{p, err}
		}()
		deadline := time.Now().Add(300 * time.Millisecond)
		for time.Now().Before(deadline) {
			require.Zero(t, lockWaits(), "a backend waits for a lock")
			select {
			case r := <-got:
				t.Fatalf("TryAcquire returned while the semaphore was being created: %v, %v", r.p, r.err)
			default:
			}
			time.Sleep(5 * time.Millisecond)
		}
		committed := time.Now()
		require.NoError(t, tx.Commit(ctx))
		var r result
		select {
		case r = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("TryAcquire did not return after the creation committed")
		}
		require.NoError(t, r.err)
		t.Logf("granted %s %v after the creation committed", r.p.Name(), time.Since(committed).Round(time.Millisecond))
		require.Equal(t, "lwt#1", r.p.Name())
		require.NoError(t, r.p.Release(ctx))
	})

	t.Run("GivesUpAfterASecond", func(t *testing.T) {
		_ = create("lwu")
		s := newSemaphore(t, b, "lwu-l", "lwu", 2)
		start := time.Now()
		_, err := s.TryAcquire(ctx, time.Minute)
		took := time.Since(start)
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.ErrorContains(t, err, "busy for 1s", "the refusal says the semaphore was busy, not held")
		t.Logf("ErrNotAcquired after %v of busy answers", took.Round(time.Millisecond))
		require.GreaterOrEqual(t, took, time.Second)
		// It gives up: a second after the first busy answer, plus the attempts' own time (a
		// bound for a try that would never give up, not for the machine's speed).
		require.Less(t, took, 10*time.Second)
	})
}

// lwSampler samples every 2 ms the backends of b's database (never another database of the
// server) that wait for a lock while running a semaphore statement, with what blocks them.
type lwSampler struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	seen    map[string]int // "<waiter> <- <blocker> (<wait event>)" -> samples
	samples int
	sum     int // backends waiting for a lock, over all samples
	max     int
}

func lwSample(t *testing.T, b *bundle) *lwSampler {
	s := &lwSampler{stop: make(chan struct{}), seen: map[string]int{}}
	s.wg.Go(func() {
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			rows, err := b.Pool.Query(b.Ctx, `SELECT a.pid, a.query, a.wait_event, coalesce(bl.query, '?')
				FROM pg_stat_activity AS a
				LEFT JOIN LATERAL unnest(pg_blocking_pids(a.pid)) AS p(pid) ON true
				LEFT JOIN pg_stat_activity AS bl ON bl.pid = p.pid AND bl.datname = a.datname
				WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'`)
			if err != nil {
				continue
			}
			pids := map[int32]bool{}
			var keys []string
			for rows.Next() {
				var pid int32
				var q, ev, by string
				if rows.Scan(&pid, &q, &ev, &by) == nil {
					pids[pid] = true
					keys = append(keys, rvStmt(q)+" <- "+rvStmt(by)+" ("+ev+")")
				}
			}
			if rows.Err() != nil {
				continue
			}
			s.mu.Lock()
			s.samples++
			s.sum += len(pids)
			s.max = max(s.max, len(pids))
			for _, k := range keys {
				s.seen[k]++
			}
			s.mu.Unlock()
		}
	})
	return s
}

// end stops the sampler, logs what it saw, and fails the test for each statement of a waiter
// (a grant attempt, SemaphoreAcquire, or a wait leaving the queue, SemaphoreLeave) seen
// waiting for a lock that another waiter's statement holds: a row lock, an insert in progress
// (wait events tuple, transactionid), an advisory lock, anything but two waits that are
// allowed, and logged: for the extension of a table (extend: a page added to fencelock.leases
// as new permits insert their rows), and at commit for PostgreSQL's lock on notifying commits
// (object: a statement that wakes waiters NOTIFYs, and PostgreSQL serialises such commits).
func (s *lwSampler) end(t *testing.T, what string) {
	t.Helper()
	close(s.stop)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.seen))
	for k := range s.seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %5d  %s", s.seen[k], k)
	}
	mean := 0.0
	if s.samples > 0 {
		mean = float64(s.sum) / float64(s.samples)
	}
	t.Logf("%s: %d samples, backends waiting for a lock: max %d, mean %.3f; sampled waits:%s", what, s.samples, s.max, mean, b.String())
	for _, k := range keys {
		if lwWaiterBehindWaiter(k) {
			t.Errorf("%s: a waiter's statement waited for another waiter's lock %d times (%s)", what, s.seen[k], k)
		}
	}
}

// lwWaiterBehindWaiter reports whether a sampled wait, "<statement> <- <blocker> (<wait
// event>)", is a waiter's statement waiting for another waiter's lock (see lwSampler.end).
func lwWaiterBehindWaiter(k string) bool {
	waiter := func(stmt string) bool { return stmt == "SemaphoreAcquire" || stmt == "SemaphoreLeave" }
	stmt, rest, _ := strings.Cut(k, " <- ")
	by, ev, _ := strings.Cut(rest, " (")
	ev = strings.TrimSuffix(ev, ")")
	return waiter(stmt) && waiter(by) && ev != "extend" && ev != "object"
}

// The promise, sampled (issue 30): 64 lessors over three pools loop on Acquire, hold 0-2 ms,
// Release (a few TryAcquire among them) on a semaphore whose limit SetLimit lowered from 16 to
// 8 while its permit 15 stays held (every grant counts the permits), for 4 s. No grant attempt
// is seen waiting for another's row lock; never more than 8 permits unexpired at once (every
// version of the permit rows logged), and each permit's tokens rise.
func TestSemaphoreNoAttemptWaitsAfterLowerLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sem = "lwl"
	rvInstallLog(t, b, sem)
	ctx := b.Ctx
	filler := newSemaphore(t, b, "lwl-filler", sem, 16)
	_, err := filler.SetLimit(ctx, 16)
	require.NoError(t, err)
	var low []*fencelock.Lease
	var top *fencelock.Lease
	for range 16 {
		p, err := filler.TryAcquire(ctx, time.Minute)
		require.NoError(t, err)
		if p.Name() == sem+"#15" {
			top = p
		} else {
			low = append(low, p)
		}
	}
	require.NotNil(t, top)
	_, err = filler.SetLimit(ctx, 8)
	require.NoError(t, err)
	for _, p := range low {
		require.NoError(t, p.Release(ctx))
	}
	pools := []*pgxpool.Pool{rvPool(t, b, 30), rvPool(t, b, 30), rvPool(t, b, 30)}
	deadline := time.Now().Add(4 * time.Second)
	sampler := lwSample(t, b)
	var grants, tries atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		s, err := fencelock.NewSemaphore(newLessor(t, pools[i%3], fmt.Sprint("lwl-", i)), sem, 8)
		require.NoError(t, err)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 30))
			for time.Now().Before(deadline) {
				var p *fencelock.Lease
				var err error
				if i%8 == 0 {
					p, err = s.TryAcquire(ctx, time.Minute)
					tries.Add(1)
				} else {
					actx, cancel := context.WithDeadline(ctx, deadline)
					p, err = s.Acquire(actx, time.Minute)
					cancel()
				}
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				grants.Add(1)
				time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
				_ = p.Release(ctx)
			}
		})
	}
	wg.Wait()
	sampler.end(t, "after a lowered limit")
	require.NoError(t, top.Release(ctx))
	spans, bad := rvCheckLog(t, b)
	t.Logf("%d grants (%d tries), %d grants logged", grants.Load(), tries.Load(), len(spans))
	require.Positive(t, grants.Load())
	require.Empty(t, bad, "more permits unexpired at once than the limit")
	requireTokensRise(t, b)
}

// The promise, sampled (issue 30): rounds of 64 lessors over three pools making the first
// acquires of a brand-new semaphore of limit 8 at the same instant (7 in 8 Acquire, the rest
// TryAcquire), each then holding its permit 0-1 ms, for 4 s. No grant attempt is seen waiting
// for another's row lock or insert, and every Acquire is granted.
func TestSemaphoreNoAttemptWaitsOnFirstAcquires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.Ctx
	pools := []*pgxpool.Pool{rvPool(t, b, 30), rvPool(t, b, 30), rvPool(t, b, 30)}
	lessors := make([]*fencelock.Lessor, 64)
	for i := range lessors {
		lessors[i] = newLessor(t, pools[i%3], fmt.Sprint("lwr-", i))
	}
	deadline := time.Now().Add(4 * time.Second)
	sampler := lwSample(t, b)
	var rounds, grants, refused int
	for round := 0; time.Now().Before(deadline); round++ {
		name := fmt.Sprint("lwr-", round)
		var mu sync.Mutex
		ready := make(chan struct{})
		var wg sync.WaitGroup
		for i, l := range lessors {
			s, err := fencelock.NewSemaphore(l, name, 8)
			require.NoError(t, err)
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(round)))
				<-ready
				var p *fencelock.Lease
				var err error
				if i%8 == 0 {
					p, err = s.TryAcquire(ctx, time.Minute)
				} else {
					p, err = s.Acquire(ctx, time.Minute)
				}
				if err != nil && i%8 != 0 {
					t.Errorf("Acquire: %v", err)
				}
				mu.Lock()
				if err != nil {
					refused++
				} else {
					grants++
				}
				mu.Unlock()
				if err == nil {
					time.Sleep(time.Duration(rng.Int64N(int64(time.Millisecond))))
					_ = p.Release(ctx)
				}
			})
		}
		close(ready)
		wg.Wait()
		rounds++
	}
	sampler.end(t, "first acquires")
	t.Logf("%d rounds, %d grants, %d tries refused", rounds, grants, refused)
	require.Positive(t, rounds)
}

// requireTokensRise fails the test if a permit's token ever went down in rv_log.
func requireTokensRise(t *testing.T, b *bundle) {
	t.Helper()
	rows, err := b.Pool.Query(b.Ctx, `SELECT name, token, lag(token) OVER (PARTITION BY name ORDER BY id) FROM rv_log`)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		var tok int64
		var prev *int64
		require.NoError(t, rows.Scan(&name, &tok, &prev))
		if prev != nil && tok < *prev {
			t.Errorf("permit %s: token %d after %d", name, tok, *prev)
		}
	}
	require.NoError(t, rows.Err())
}

// The sampled tests' verdict on a wait: only a waiter's statement behind another waiter's, for
// anything but a table's extension or the lock on notifying commits, breaks the promise.
func TestSemaphoreLockWaitVerdict(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		wait   string
		breaks bool
	}{
		{"SemaphoreAcquire <- SemaphoreAcquire (tuple)", true},
		{"SemaphoreAcquire <- SemaphoreAcquire (transactionid)", true},
		{"SemaphoreAcquire <- SemaphoreLeave (advisory)", true},
		{"SemaphoreLeave <- SemaphoreAcquire (tuple)", true},
		{"SemaphoreAcquire <- SemaphoreAcquire (extend)", false},
		{"SemaphoreAcquire <- SemaphoreAcquire (object)", false},
		{"SemaphoreAcquire <- SemaphoreRelease (transactionid)", false},
		{"SemaphoreAcquire <- ? (tuple)", false},
		{"SemaphoreRelease <- SemaphoreAcquire (transactionid)", false},
	} {
		require.Equal(t, c.breaks, lwWaiterBehindWaiter(c.wait), c.wait)
	}
}
