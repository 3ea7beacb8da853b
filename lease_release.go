package fencelock

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/queue"
)

// The outcomes of LeaseRelease (fencelock.hand_off).
const (
	releaseNotCurrent  = 0 // the grant had expired or been taken over: nothing changed
	releaseReleased    = 1 // released, not handed over
	releaseHanded      = 2 // handed to the head of the queue, which polls
	releaseHandedWoken = 3 // handed to the head of the queue, and woken by NOTIFY
)

// leaseRelease runs LeaseRelease on pool for (name, holder, token): it ends the grant and
// hands it to the head of the name's queue, if any. It reports whether the grant was still
// current. It is the release of every lease that is not a semaphore's permit (Lease.release,
// and the grants nobody uses: Lessor.releaseToken).
func leaseRelease(ctx context.Context, q *db.Queries, pool *pgxpool.Pool, holder, name string, token Token) (bool, error) {
	outcome, err := q.LeaseRelease(ctx, pool, db.LeaseReleaseParams{Name: name, Holder: holder, Token: int64(token)})
	if err != nil {
		return false, wrapPg(fmt.Sprintf("release lease %q", name), err)
	}
	if outcome == releaseHandedWoken {
		queue.CountWakeup()
	}
	return outcome != releaseNotCurrent, nil
}
