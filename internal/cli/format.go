package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// formatDuration renders d compactly and deterministically, rounded to the unit shown:
// "850ms" under a second, "4.2s" under a minute, "3m05s" under an hour, "2h01m" under a day,
// "3d04h" beyond. A negative d renders as "0ms".
func formatDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if r := d.Round(time.Millisecond); r < time.Second {
		return fmt.Sprintf("%dms", r.Milliseconds())
	}
	if r := d.Round(100 * time.Millisecond); r < time.Minute {
		return fmt.Sprintf("%d.%ds", r/time.Second, r%time.Second/(100*time.Millisecond))
	}
	if r := d.Round(time.Second); r < time.Hour {
		return fmt.Sprintf("%dm%02ds", r/time.Minute, r%time.Minute/time.Second)
	}
	if r := d.Round(time.Minute); r < 24*time.Hour {
		return fmt.Sprintf("%dh%02dm", r/time.Hour, r%time.Hour/time.Minute)
	}
	r := d.Round(time.Hour)
	return fmt.Sprintf("%dd%02dh", r/(24*time.Hour), r%(24*time.Hour)/time.Hour)
}

// cell makes s safe for one table cell: a string with control characters (a tab or newline
// would break the table) is shown Go-quoted.
func cell(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

// plural renders "1 renewal" or "3 renewals".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(n, 10) + " " + many
}

// backendLabel names a backend as the tables show it: "pid 1234 (10.0.0.7)", or "pid 1234"
// when the address is unknown (a Unix socket, or a session of another role read without
// pg_read_all_stats).
func backendLabel(pid int32, addr string) string {
	if addr == "" {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%s)", pid, addr)
}

// joinPIDs renders pids as "1,2".
func joinPIDs(pids []int32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

// seconds converts microseconds to seconds, for JSON.
func seconds(us int64) float64 { return float64(us) / 1e6 }

// micros converts microseconds to a time.Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
