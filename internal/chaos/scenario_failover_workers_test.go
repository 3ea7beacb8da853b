package chaos

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
)

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
