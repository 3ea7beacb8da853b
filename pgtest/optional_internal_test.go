package pgtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// recordTB records what a missing program does to a test: skip or fail, and with which message.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper()                   {}
func (r *recordTB) Skipf(f string, a ...any)  { r.skipped = fmt.Sprintf(f, a...) }
func (r *recordTB) Fatalf(f string, a ...any) { r.failed = fmt.Sprintf(f, a...) }
func (r *recordTB) Skip(a ...any)             { r.skipped = fmt.Sprint(a...) }
func (r *recordTB) Fatal(a ...any)            { r.failed = fmt.Sprint(a...) }
func (r *recordTB) Errorf(f string, a ...any) { r.failed = fmt.Sprintf(f, a...) }

// A missing optional program skips a test with the install command, unless CI is true: then
// it fails it, so that CI never passes by skipping.
func TestMissingProgram(t *testing.T) {
	for _, tc := range []struct {
		ci       string
		skip     bool
		contains string
	}{
		{"", true, "apt-get install no-such-program) (skipped; with CI=true this fails)"},
		{"false", true, "apt-get install no-such-program"},
		{"true", false, "apt-get install no-such-program) (CI=true: optional programs are required here)"},
		{"1", false, "optional programs are required here"},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			rec := &recordTB{TB: t}
			require.Empty(t, LookProgram(rec, "fencelock-no-such-program", "apt-get install no-such-program"))
			if tc.skip {
				require.Contains(t, rec.skipped, tc.contains)
				require.Empty(t, rec.failed)
			} else {
				require.Contains(t, rec.failed, tc.contains)
				require.Empty(t, rec.skipped)
			}
		})
	}
	rec := &recordTB{TB: t}
	require.True(t, strings.HasSuffix(LookProgram(rec, "sh", "apt-get install dash"), "/sh"), "a program on PATH is found")
	require.Empty(t, rec.skipped+rec.failed)
}
