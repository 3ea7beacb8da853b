package job_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/job"
)

// Issue 22 review. When JobFinish records nothing (n == 0) while the run's grant is still
// current on the database (here: the run's ledger row deleted by hand mid-run), base
// (fd9a72a, job.go) ended the lease as lost on the spot (lease.lost(errGoneOnServer): Done
// closed with a *LeaseLostError, the loss logged and counted), and RunSlot's release then
// freed the name. The redesign's goneOnServer asks Lease.GuardTx, which finds the grant
// current and ends nothing: RunSlot still reports a *LeaseLostError, but the lease itself ends
// as released (Err: ErrReleased; counted as released, no "lease lost" log). The code comment on
// goneOnServer says so ("the loss is reported all the same and the lease is left to RunSlot's
// release"); it is a behaviour change all the same.
//
// Fails on the redesign (lease.Err() is ErrReleased); passes on base semantics.
func TestReviewJobFinishNotRecordedLeaseCurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slot := time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC)
	const name = "job:review-row-gone"
	j := newJob(t, b, "review-row-gone", name, 10*time.Second, nil)
	var lease *fencelock.Lease
	err := j.RunSlot(b.ctx, slot, func(ctx context.Context, run *job.Run) error {
		lease = run.Lease
		_, err := b.pool.Exec(b.ctx, `DELETE FROM fencelock.job_runs WHERE job = $1`, name)
		return err
	})
	require.NotNil(t, lease)
	require.ErrorContains(t, err, "outcome not recorded")
	require.ErrorIs(t, err, fencelock.ErrLeaseLost)
	require.ErrorIs(t, lease.Err(), fencelock.ErrLeaseLost, "the lease ended as released, not as lost")
}
