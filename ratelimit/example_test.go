package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/ratelimit"
)

// The examples run against the test server of TestMain (main_test.go), each on a fresh
// database with fencelock's schema, and their output is checked; with go test -short they are
// skipped. In a program, the pool is yours: pgxpool.New(ctx, os.Getenv("DATABASE_URL")), then
// fencelock.Migrate(ctx, pool) once.

// A rate limit of 10 a second with a burst of 3: three requests at once, the fourth refused
// with the time until it is due.
func ExampleLimiter_Allow() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
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

// A rate limit of 20 requests a second per domain, in bursts of up to 5, shared by every
// process on the database.
func ExampleLimiter_Wait() {
	ctx := context.Background()
	pool, stop := pgserver.ExamplePool(ctx)
	defer stop()
	rl, err := ratelimit.New(pool, ratelimit.Limit{Rate: 20, Per: time.Second, Burst: 5})
	if err != nil {
		log.Fatal(err)
	}
	start := time.Now()
	for range 10 {
		if _, err := rl.Wait(ctx, "domain:example.com", 1); err != nil { // sleeps until allowed
			log.Fatal(err)
		}
		// ... send the request ...
	}
	// Five at once (the burst), then one every 50 ms: the tenth is due 250 ms after the first.
	fmt.Println("10 requests took at least 200ms:", time.Since(start) >= 200*time.Millisecond)
	// Output:
	// 10 requests took at least 200ms: true
}
