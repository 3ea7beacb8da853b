package integration

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/pgtest"
	"github.com/fencelock/fencelock/ratelimit"
)

// exampleDB starts a throwaway Postgres (as the examples in README do when DATABASE_URL is
// unset) with a migrated database, and returns a pool on it and a func that stops it all.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	srv, err := pgtest.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_, url, err := srv.CreateDatabase(ctx)
	if err != nil {
		_ = srv.Close()
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		_ = srv.Close()
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); _ = srv.Close() }
}

// A lease guards a payment capture; the fence in the same transaction rejects the write of a
// holder whose lease has moved on.
func Example_fencedCapture() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if err := fencelock.Migrate(ctx, pool); err != nil { // idempotent
		log.Fatal(err)
	}

	capture := func(lease *fencelock.Lease) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := lease.FenceTx(ctx, tx, "payment:42"); err != nil {
				return err
			}
			// ... the protected write, in tx: UPDATE payments SET status = 'captured' ...
			return nil
		})
	}

	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"))
	old, err := w1.TryAcquire(ctx, "payment:42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	// worker-1 stalls; its lease moves on (here: released; in life: expired) to worker-2.
	_ = old.Release(ctx)
	cur, err := w2.TryAcquire(ctx, "payment:42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer cur.Release(ctx)
	fmt.Println("worker-2 captured:", capture(cur) == nil)

	// worker-1 wakes up and writes: the lease is no longer its own, so lease.FenceTx refuses.
	err = capture(old)
	fmt.Println("worker-1 refused:", err != nil)
	// A write that carries only its token, as one sent by a holder paused after its check, is
	// rejected by the fence, atomically: worker-2's token is larger.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return fencelock.FenceTx(ctx, tx, "payment:42", old.Token())
	})
	fmt.Println("worker-1's token rejected:", errors.Is(err, fencelock.ErrStaleToken))
	// Output:
	// worker-2 captured: true
	// worker-1 refused: true
	// worker-1's token rejected: true
}

func Example_tryAcquire() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()

	a, _ := fencelock.NewLessor(pool, fencelock.WithHolder("a"))
	b, _ := fencelock.NewLessor(pool, fencelock.WithHolder("b"))
	la, err := a.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "nightly-report", 30*time.Second)
	fmt.Println("b while a holds:", errors.Is(err, fencelock.ErrNotAcquired))

	if err := la.Release(ctx); err != nil {
		log.Fatal(err)
	}
	<-la.Done()
	fmt.Println("a after release:", la.Err())

	lb, err := b.TryAcquire(ctx, "nightly-report", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("b's token is larger:", lb.Token() > la.Token())
	_ = lb.Release(ctx)
	// Output:
	// b while a holds: true
	// a after release: fencelock: lease released
	// b's token is larger: true
}

func Example_runLocked() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()

	l, _ := fencelock.NewLessor(pool)
	err := l.RunLocked(ctx, "inventory:sku-1", func(ctx context.Context, tx pgx.Tx, token fencelock.Token) error {
		// The lease row is held FOR UPDATE until this transaction ends; no TTL, no heartbeat.
		return fencelock.FenceTx(ctx, tx, "inventory:sku-1", token)
	})
	fmt.Println("ran locked:", err == nil)
	// Output:
	// ran locked: true
}

// Session advisory locks: TryLock does not wait (ErrNotAcquired while another session holds
// the lock), Lock waits on the server until the holder unlocks, and Unlock ends the lock and
// closes its Done.
func Example_advisoryLock() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()

	a, _ := fencelock.NewAdvisoryLocker(pool)
	b, _ := fencelock.NewAdvisoryLocker(pool)
	la, err := a.TryLock(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryLock(ctx, "nightly-report")
	fmt.Println("b.TryLock while a holds it:", errors.Is(err, fencelock.ErrNotAcquired))

	// b.Lock waits in the server's queue for the lock until a unlocks it (or ctx ends).
	got := make(chan *fencelock.AdvisoryLock, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		lb, err := b.Lock(wctx, "nightly-report")
		if err != nil {
			log.Fatal(err)
		}
		got <- lb
	}()
	if err := la.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	<-la.Done()
	fmt.Println("a after Unlock:", la.Err())
	lb := <-got
	fmt.Println("b.Lock granted:", lb.Name())
	if err := lb.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// b.TryLock while a holds it: true
	// a after Unlock: fencelock: advisory lock unlocked
	// b.Lock granted: nightly-report
}

// Transaction advisory locks: taken on the caller's pgx.Tx and released by its commit or
// rollback, with no Unlock. With WithFencingTokens each grant also draws a fencing token for
// FenceTx.
func Example_advisoryLockTx() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()

	a, _ := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
	tx1, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	token1, err := a.TryLockTx(ctx, tx1, "rebuild-index")
	if err != nil {
		log.Fatal(err)
	}
	if err := fencelock.FenceTx(ctx, tx1, "search-index", token1); err != nil {
		log.Fatal(err)
	}

	// Another transaction is refused while tx1 holds the lock.
	err = pgx.BeginFunc(ctx, pool, func(tx2 pgx.Tx) error {
		_, err := a.TryLockTx(ctx, tx2, "rebuild-index")
		return err
	})
	fmt.Println("TryLockTx while tx1 holds it:", errors.Is(err, fencelock.ErrNotAcquired))

	// tx1's commit releases its lock. LockTx waits for the lock (here it is free already).
	if err := tx1.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	var token2 fencelock.Token
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		if token2, err = a.LockTx(ctx, tx, "rebuild-index"); err != nil {
			return err
		}
		return fencelock.FenceTx(ctx, tx, "search-index", token2)
	})
	fmt.Println("LockTx after tx1 committed:", err == nil)
	fmt.Println("its token is larger:", token2 > token1)
	// Output:
	// TryLockTx while tx1 holds it: true
	// LockTx after tx1 committed: true
	// its token is larger: true
}

// The guarded write: Lease.GuardTx (or Lease.FenceTx) in the caller's transaction, then the
// protected write, which commits only if the grant is still current. What the caller does
// with the two errors: a *fencelock.LeaseLostError means the lease is no longer its own (stop
// all work under it); a *fencelock.StaleTokenError means the lease is current but a larger
// token has written the resource (the write is outdated: roll back, do not retry with this
// token).
func Example_guardTx() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL);
INSERT INTO jobs VALUES (1, 'queued')`); err != nil {
		log.Fatal(err)
	}

	// setState sets job 1's state in one transaction, after check (GuardTx or FenceTx).
	setState := func(who, state string, check func(pgx.Tx) error) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := check(tx); err != nil {
				return err // rolls tx back
			}
			_, err := tx.Exec(ctx, `UPDATE jobs SET state = $1 WHERE id = 1`, state)
			return err
		})
		var lost *fencelock.LeaseLostError
		var stale *fencelock.StaleTokenError
		switch {
		case err == nil:
			fmt.Printf("%s: job 1 %s\n", who, state)
		case errors.As(err, &lost): // errors.Is(err, fencelock.ErrLeaseLost)
			fmt.Printf("%s: lease %s lost (%v): stop working under it\n", who, lost.Name, lost.Cause)
		case errors.As(err, &stale): // errors.Is(err, fencelock.ErrStaleToken)
			fmt.Printf("%s: stale token for %s: a newer writer won, drop this write\n", who, stale.Resource)
		default:
			log.Fatal(err)
		}
	}

	// worker-1 renews nothing (as a paused process would): its lease has a short TTL.
	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"), fencelock.WithoutHeartbeat())
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"))
	l1, err := w1.TryAcquire(ctx, "job:1", 250*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	setState("worker-1", "running", func(tx pgx.Tx) error { return l1.GuardTx(ctx, tx) })

	// worker-2 waits until worker-1's lease has expired on the database, and takes it over.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l2, err := w2.Acquire(actx, "job:1", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer l2.Release(ctx)
	setState("worker-1", "done", func(tx pgx.Tx) error { return l1.GuardTx(ctx, tx) })
	setState("worker-2", "done", func(tx pgx.Tx) error { return l2.FenceTx(ctx, tx, "job:1") })

	// A resource's fence sees the tokens of every lease that writes it: here an operator's
	// lease on all jobs, granted after worker-2's, writes job 1 first.
	ops, _ := fencelock.NewLessor(pool, fencelock.WithHolder("ops"))
	all, err := ops.TryAcquire(ctx, "jobs:all", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer all.Release(ctx)
	setState("ops", "cancelled", func(tx pgx.Tx) error { return all.FenceTx(ctx, tx, "job:1") })
	setState("worker-2", "archived", func(tx pgx.Tx) error { return l2.FenceTx(ctx, tx, "job:1") })

	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM jobs WHERE id = 1`).Scan(&state); err != nil {
		log.Fatal(err)
	}
	fmt.Println("job 1 is", state)
	// Output:
	// worker-1: job 1 running
	// worker-1: lease job:1 lost (fencelock: trust window expired): stop working under it
	// worker-2: job 1 done
	// ops: job 1 cancelled
	// worker-2: stale token for job:1: a newer writer won, drop this write
	// job 1 is cancelled
}

// UpdateFencedTx fences an update of the caller's own table with a token column: the row keeps
// the largest token that wrote it, and a write with a smaller one is rejected.
func Example_updateFencedTx() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance_cents bigint NOT NULL, fence_token bigint);
INSERT INTO accounts VALUES (7, 0, NULL)`); err != nil {
		log.Fatal(err)
	}
	setBalance := func(token fencelock.Token, id, cents int) (int64, error) {
		var n int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			n, err = fencelock.UpdateFencedTx(ctx, tx, pgx.Identifier{"accounts"}, "fence_token", token,
				[]fencelock.Column{{Name: "balance_cents", Value: cents}},
				[]fencelock.Column{{Name: "id", Value: id}})
			return err
		})
		return n, err
	}

	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"))
	old, err := w1.TryAcquire(ctx, "account:7", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	// worker-1 stalls; its lease moves on (here: released; in life: expired) to worker-2.
	_ = old.Release(ctx)
	cur, err := w2.TryAcquire(ctx, "account:7", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer cur.Release(ctx)
	n, err := setBalance(cur.Token(), 7, 500)
	fmt.Println("worker-2 updated rows:", n, err)

	// worker-1 wakes up and writes with its old token: rejected, nothing changed.
	_, err = setBalance(old.Token(), 7, 100)
	var stale *fencelock.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Printf("worker-1 rejected: table %s, row %s\n", stale.Table, stale.Key)
		fmt.Println("its token is worker-1's:", stale.Token == old.Token())
		fmt.Println("the row's token is worker-2's:", stale.Current == cur.Token())
	}
	// No row for the key is not a stale token.
	_, err = setBalance(cur.Token(), 8, 100)
	fmt.Println("account 8:", errors.Is(err, fencelock.ErrNoRow))

	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance_cents FROM accounts WHERE id = 7`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// worker-2 updated rows: 1 <nil>
	// worker-1 rejected: table accounts, row id=7
	// its token is worker-1's: true
	// the row's token is worker-2's: true
	// account 8: true
	// balance: 500
}

// A worker stops its work when its lease's Done closes, and Err says why: ErrReleased after
// Release, a *fencelock.LeaseLostError (matching ErrLeaseLost) when the lease was lost.
func Example_leaseDone() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()

	// work runs units of work under lease until its Done closes, and returns the cause.
	work := func(lease *fencelock.Lease) error {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-lease.Done():
				return lease.Err()
			case <-tick.C:
				// ... one unit of work, its writes fenced with lease.FenceTx ...
			}
		}
	}
	// start runs work in a goroutine; the func it returns waits for the worker to stop, and
	// fails the example if it does not within 5s.
	start := func(lease *fencelock.Lease) (wait func() error) {
		stopped := make(chan error, 1)
		go func() { stopped <- work(lease) }()
		return func() error {
			select {
			case err := <-stopped:
				return err
			case <-time.After(5 * time.Second):
				log.Fatalf("lease %s: Done did not close", lease.Name())
				return nil
			}
		}
	}

	// Released by its holder.
	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	lease, err := w1.TryAcquire(ctx, "report:daily", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	wait := start(lease)
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	err = wait()
	fmt.Println("worker-1 stopped, released:", errors.Is(err, fencelock.ErrReleased))

	// Lost and taken over. Nothing renews worker-2's lease (as in a paused process): its trust
	// window ends (TTL - safety margin after the grant was sent) before the lease expires on
	// the database, where worker-3 waits to take it over.
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"), fencelock.WithoutHeartbeat())
	w3, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-3"))
	paused, err := w2.TryAcquire(ctx, "report:daily", 200*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	wait = start(paused)
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	taken, err := w3.Acquire(actx, "report:daily", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer taken.Release(ctx)
	err = wait()
	var lost *fencelock.LeaseLostError
	fmt.Println("worker-2 stopped, lost:", errors.As(err, &lost), errors.Is(err, fencelock.ErrLeaseLost))
	fmt.Println("cause:", lost.Cause)
	fmt.Println("worker-3's token is larger:", taken.Token() > paused.Token())
	fmt.Println("worker-2's Release:", errors.Is(paused.Release(ctx), fencelock.ErrNotHeld))
	// Output:
	// worker-1 stopped, released: true
	// worker-2 stopped, lost: true true
	// cause: fencelock: trust window expired
	// worker-3's token is larger: true
	// worker-2's Release: true
}

// A semaphore of limit 2: two permits, a third refused while they are held; one released, the
// next caller gets its slot, with a larger token.
func Example_semaphore() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if err := fencelock.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	lessor, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	sem, err := fencelock.NewSemaphore(lessor, "domain:example.com", 2)
	if err != nil {
		log.Fatal(err)
	}
	a, _ := sem.Acquire(ctx, 30*time.Second)
	b, _ := sem.Acquire(ctx, 30*time.Second)
	fmt.Println(a.Name(), b.Name())
	_, err = sem.TryAcquire(ctx, 30*time.Second)
	fmt.Println("third:", err)
	_ = a.Release(ctx)
	c, _ := sem.TryAcquire(ctx, 30*time.Second)
	fmt.Println("after a release:", c.Name(), "token larger:", c.Token() > a.Token())
	st, _ := sem.State(ctx)
	fmt.Printf("held %d of %d\n", st.Held, st.Limit)
	_ = b.Release(ctx)
	_ = c.Release(ctx)
	// Output:
	// domain:example.com#0 domain:example.com#1
	// third: fencelock: not acquired: held by another holder
	// after a release: domain:example.com#0 token larger: true
	// held 2 of 2
}

// A rate limit of 10 a second with a burst of 3: three requests at once, the fourth refused
// with the time until it is due.
func Example_rateLimit() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if err := fencelock.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	rl, err := ratelimit.New(pool, ratelimit.Limit{Rate: 10, Per: time.Second, Burst: 3})
	if err != nil {
		log.Fatal(err)
	}
	for range 4 {
		res, _ := rl.Allow(ctx, "domain:example.com")
		fmt.Println("allowed:", res.Allowed, "remaining:", res.Remaining, "retry within 100ms:", res.RetryAfter > 0 && res.RetryAfter <= 100*time.Millisecond)
	}
	// Output:
	// allowed: 1 remaining: 2 retry within 100ms: false
	// allowed: 1 remaining: 1 retry within 100ms: false
	// allowed: 1 remaining: 0 retry within 100ms: false
	// allowed: 0 remaining: 0 retry within 100ms: true
}

// Two leases all or nothing: refused whole while one member is held elsewhere, granted whole
// once it is free, with a token per member.
func Example_multiLock() {
	ctx := context.Background()
	pool, stop := exampleDB(ctx)
	defer stop()
	if err := fencelock.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	w1, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-1"))
	w2, _ := fencelock.NewLessor(pool, fencelock.WithHolder("worker-2"))
	held, _ := w1.TryAcquire(ctx, "account:3", 10*time.Second)
	_, err := w2.TryAcquireAll(ctx, []string{"account:7", "account:3"}, 10*time.Second)
	fmt.Println("while account:3 is held:", err)
	_ = held.Release(ctx)
	set, err := w2.TryAcquireAll(ctx, []string{"account:7", "account:3"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range set.Leases() {
		fmt.Println(l.Name(), "held by", l.Holder())
	}
	fmt.Println("account:3's token above the last holder's:", set.Lease("account:3").Token() > held.Token())
	_ = set.Release(ctx)
	// Output:
	// while account:3 is held: fencelock: not acquired: held by another holder
	// account:3 held by worker-2
	// account:7 held by worker-2
	// account:3's token above the last holder's: true
}
