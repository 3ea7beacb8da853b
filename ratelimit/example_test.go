package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/ratelimit"
)

// This example is compiled with the package's tests but not run: it needs a PostgreSQL server
// (DATABASE_URL) where fencelock.Migrate has run. Its runnable version, with the output
// checked, is Example_rateLimit in internal/integration/example_test.go.

// A rate limit of 20 requests a second per domain, in bursts of up to 5, shared by every
// process on the database.
func ExampleLimiter_Wait() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	rl, err := ratelimit.New(pool, ratelimit.Limit{Rate: 20, Per: time.Second, Burst: 5})
	if err != nil {
		log.Fatal(err)
	}
	for range 10 {
		if _, err := rl.Wait(ctx, "domain:example.com", 1); err != nil { // sleeps until allowed
			log.Fatal(err)
		}
		// ... send the request ...
	}
	res, err := rl.Allow(ctx, "domain:example.com")
	if err != nil {
		log.Fatal(err)
	}
	if res.Allowed == 0 {
		fmt.Println("refused; retry after", res.RetryAfter.Round(time.Millisecond))
	}
}
