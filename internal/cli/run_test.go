package cli

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantPos []string
		force   bool
		fence   []string
	}{
		{"FlagsFirst", []string{"--force", "--fence", "a", "job"}, []string{"job"}, true, []string{"a"}},
		{"FlagsAfter", []string{"job", "--force", "--fence", "a", "--fence=b"}, []string{"job"}, true, []string{"a", "b"}},
		{"Terminator", []string{"--force", "--", "--fence"}, []string{"--fence"}, true, nil},
		{"None", nil, nil, false, nil},
		// A negative advisory key is an argument, before or after the flags; a flag's value
		// that looks like one stays the flag's.
		{"NegativeKey", []string{"--force", "-5"}, []string{"-5"}, true, nil},
		{"NegativePair", []string{"-1,5", "--force"}, []string{"-1,5"}, true, nil},
		{"NegativeFlagValue", []string{"--force", "--fence", "-5", "job"}, []string{"job"}, true, []string{"-5"}},
		{"NegativeAfterBoolFlag", []string{"--force", "-5", "--fence=-6"}, []string{"-5"}, true, []string{"-6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			force := fs.Bool("force", false, "")
			var fence stringList
			fs.Var(&fence, "fence", "")
			pos, err := parseInterspersed(fs, tc.args)
			require.NoError(t, err)
			require.Equal(t, tc.wantPos, pos)
			require.Equal(t, tc.force, *force)
			require.Equal(t, tc.fence, []string(fence))
		})
	}
}

// Usage errors exit with ExitUsage and one line on stderr, before any connection is tried.
func TestRunUsageErrors(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"NoCommand", nil, "fencelock: no command given\n"},
		{"UnknownCommand", []string{"lcoks"}, "fencelock: unknown command \"lcoks\" (see fencelock help)\n"},
		{"UnknownFlag", []string{"locks", "--nope"}, "fencelock: locks: flag provided but not defined: -nope (see fencelock help locks)\n"},
		{"NoDatabase", []string{"locks"}, "fencelock: no database: give --database-url or set DATABASE_URL\n"},
		{"ReleaseWithoutForce", []string{"release", "job"}, "fencelock: release: a release of someone else's lock needs --force: fencelock release --force job\n"},
		{"ReleaseTwoNames", []string{"release", "--force", "a", "b"}, "fencelock: release: want one NAME, got 2 arguments\n"},
		{"ReleaseLongName", []string{"release", "--force", strings.Repeat("n", 1025)}, "fencelock: release: NAME or --fence \"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\": is 1025 bytes long; the limit is 1024\n"},
		{"ReleaseFenceWithNUL", []string{"release", "--force", "--fence", "a\x00b", "job"}, "fencelock: release: NAME or --fence \"a\\x00b\": contains a NUL byte\n"},
		{"SweepShortGrace", []string{"sweep", "--grace", "30s"}, "fencelock: sweep: --grace 30s is shorter than the minimum, 1m0s\n"},
		{"WatchShortInterval", []string{"watch", "--interval", "1ms"}, "fencelock: watch: --interval 1ms is shorter than 10ms\n"},
		{"UIShortInterval", []string{"ui", "--interval", "1ms"}, "fencelock: ui: --interval 1ms: must be from 100ms to 1m\n"},
		{"UILongWindow", []string{"ui", "--window", "48h"}, "fencelock: ui: --window 48h0m0s: must be from 10s to 24h\n"},
		{"UIReleaseURLWithoutAllow", []string{"ui", "--release-database-url", "postgres://h/db"}, "fencelock: ui: --release-database-url needs --allow-release\n"},
		{"UIAllowWithoutSecret", []string{"ui", "--allow-release"}, "fencelock: ui: --allow-release needs an access token of at least 16 bytes in FENCELOCK_UI_SECRET\n"},
		{"UINoDatabase", []string{"ui"}, "fencelock: no database: give --database-url or set DATABASE_URL\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := Run(context.Background(), tc.args, noEnv, nil, &stdout, &stderr)
			require.Equal(t, ExitUsage, code)
			// The usage goes to stderr only when no command is given.
			require.True(t, strings.HasSuffix(stderr.String(), tc.wantErr), "stderr: %q", stderr.String())
		})
	}
}

func TestRunHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"help", "release"}, {"release", "-h"}} {
		var stdout, stderr strings.Builder
		require.Equal(t, ExitOK, Run(context.Background(), args, nil, nil, &stdout, &stderr), "%v", args)
		require.Contains(t, stdout.String(), "Exit codes:", "%v", args)
		require.Empty(t, stderr.String(), "%v", args)
	}
	var stdout strings.Builder
	Run(context.Background(), []string{"help"}, nil, nil, &stdout, io.Discard)
	for _, c := range commands() {
		require.Contains(t, stdout.String(), "  "+c.name+" ")
	}
	require.Contains(t, stdout.String(), "--lock-timeout duration")
}
