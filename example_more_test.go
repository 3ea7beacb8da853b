package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// The examples of fenced updates of the caller's tables, advisory locks, semaphores, rate
// limits and sets of leases, run as those of example_test.go are.

// UpdateFencedTx fences an update of the caller's own table with a token column: the row keeps
// the largest token that wrote it, and a write with a smaller one is rejected.
func ExampleUpdateFencedTx() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
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

// Session advisory locks: TryLock does not wait (ErrNotAcquired while another session holds
// the lock), Lock waits on the server until the holder unlocks, and Unlock ends the lock and
// closes its Done.
func ExampleAdvisoryLocker_TryLock() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
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
func ExampleAdvisoryLocker_TryLockTx() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
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

// A semaphore of limit 2: two permits, a third refused while they are held; one released, the
// next caller gets its slot, with a larger token.
func ExampleSemaphore_Acquire() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
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
	// third: fencelock: not acquired: semaphore "domain:example.com": all 2 permits held
	// after a release: domain:example.com#0 token larger: true
	// held 2 of 2
}

// Two leases all or nothing: refused whole while one member is held elsewhere, granted whole
// once it is free, with a token per member.
func ExampleLessor_TryAcquireAll() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
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
