package job_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/job"
)

// When JobFinish records nothing while the run's grant is still current on the database (here:
// the run's ledger row deleted by hand mid-run), RunSlot reports the outcome unrecorded with a
// *LeaseLostError, and the lease, which nobody took over, ends through RunSlot's release
// (ErrReleased). Before issue 22 the job ended such a lease as lost on the spot, through the
// lease's internals; the job package now asks Lease.GuardTx, which finds the grant current
// (issue 22's review; CHANGELOG.md).
func TestJobFinishNotRecordedLeaseCurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC)
	const name = "job:review-row-gone"
	j := newJob(t, b, "review-row-gone", name, 10*time.Second, nil)
	var lease *fencelock.Lease
	err := j.RunSlot(b.Ctx, slot, func(ctx context.Context, run *job.Run) error {
		lease = run.Lease
		_, err := b.Pool.Exec(b.Ctx, `DELETE FROM fencelock.job_runs WHERE job = $1`, name)
		return err
	})
	require.NotNil(t, lease)
	require.ErrorContains(t, err, "outcome not recorded")
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	<-lease.Done()
	require.ErrorIs(t, lease.Err(), fencelock.ErrReleased, "the lease, still current, ends by RunSlot's release")
}
