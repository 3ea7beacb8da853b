package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/ratelimit"
)

// process runs one worker process's workers until ctx ends.
func process(ctx context.Context, id, url string) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.MaxConns = workers + 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	lessor, err := fencelock.NewLessor(pool, fencelock.WithHolder(id))
	if err != nil {
		return err
	}
	caps := map[string]*fencelock.Semaphore{}
	for _, d := range domains {
		if caps[d], err = fencelock.NewSemaphore(lessor, "scraper:domain:"+d, domainCap); err != nil {
			return err
		}
	}
	rate, err := ratelimit.New(pool, ratelimit.Limit{Rate: domainRate, Per: time.Second, Burst: 1})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		worker := fmt.Sprintf("%s/w%d", id, w)
		wg.Go(func() { errs[w] = work(ctx, pool, lessor, caps, rate, worker) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// work is one worker: an account at a time, a few requests with it, until ctx ends.
func work(ctx context.Context, pool *pgxpool.Pool, lessor *fencelock.Lessor, caps map[string]*fencelock.Semaphore, rate *ratelimit.Limiter, worker string) error {
	for ctx.Err() == nil {
		account := fmt.Sprintf("scraper:account:%d", rand.IntN(accounts))
		acc, err := lessor.TryAcquire(ctx, account, leaseTTL)
		if errors.Is(err, fencelock.ErrNotAcquired) || errors.Is(err, fencelock.ErrAlreadyHeld) {
			time.Sleep(rand.N(5 * time.Millisecond)) // another worker has it: try another
			continue
		}
		if err != nil {
			return ignoreEnd(ctx, err)
		}
		var lost error
		for range 1 + rand.IntN(4) {
			err := request(ctx, pool, acc, caps, rate, worker)
			if errors.Is(err, fencelock.ErrLeaseLost) {
				lost = err // paused past the TTL, say: what it held has moved on; start over
				break
			}
			if err != nil {
				_ = acc.Release(context.WithoutCancel(ctx))
				return ignoreEnd(ctx, err)
			}
		}
		if lost != nil {
			if _, err := pool.Exec(ctx, `INSERT INTO scraper_lost (worker, error) VALUES ($1, $2)`, worker, lost.Error()); err != nil {
				return ignoreEnd(ctx, err)
			}
		}
		if err := acc.Release(ctx); err != nil && !errors.Is(err, fencelock.ErrNotHeld) && !errors.Is(err, fencelock.ErrLeaseLost) {
			return ignoreEnd(ctx, err)
		}
	}
	return nil
}

// request makes one request with account lease acc to a random domain: a permit of the
// domain's semaphore, a token of its rate limit, then the request, recorded at its start and
// its end in transactions that guard the account's lease and the permit.
func request(ctx context.Context, pool *pgxpool.Pool, acc *fencelock.Lease, caps map[string]*fencelock.Semaphore, rate *ratelimit.Limiter, worker string) error {
	domain := domains[rand.IntN(len(domains))]
	permit, err := caps[domain].Acquire(ctx, leaseTTL)
	if err != nil {
		return err
	}
	defer func() { _ = permit.Release(context.WithoutCancel(ctx)) }()
	allowed, err := rate.Wait(ctx, "scraper:domain:"+domain, 1)
	if err != nil {
		return err
	}
	var id int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := acc.GuardTx(ctx, tx); err != nil {
			return err
		}
		if err := permit.GuardTx(ctx, tx); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO scraper_requests (domain, account, worker, allowed_at, started_at)
			VALUES ($1, $2, $3, $4, clock_timestamp()) RETURNING id`, domain, acc.Name(), worker, allowed.At).Scan(&id)
	})
	if err != nil {
		return err
	}
	time.Sleep(40*time.Millisecond + rand.N(40*time.Millisecond)) // the request: 40-80 ms, so the cap binds
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := acc.GuardTx(ctx, tx); err != nil {
			return err
		}
		if err := permit.GuardTx(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE scraper_requests SET ended_at = clock_timestamp() WHERE id = $1`, id)
		return err
	})
}

// ignoreEnd drops the error of a call cut short by the end of the run.
func ignoreEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
