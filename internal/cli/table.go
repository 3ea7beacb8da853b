package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// locksHeader is the header of the locks table.
var locksHeader = []string{"KIND", "RESOURCE", "HOLDER", "TOKEN", "TTL LEFT", "HEARTBEAT", "HELD FOR", "WAITERS"}

// writeLocksTable writes rows as the locks table, or "no locks held".
func writeLocksTable(w io.Writer, rows []lockRow) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "no locks held")
		return err
	}
	cells := make([][]string, len(rows))
	for i, r := range rows {
		cells[i] = lockCells(r)
	}
	return writeTable(w, locksHeader, cells)
}

// lockCells renders one row of the locks table.
func lockCells(r lockRow) []string {
	heldFor := "-"
	if r.heldFor != nil {
		heldFor = formatDuration(*r.heldFor)
	}
	if r.Kind == "advisory" {
		return []string{r.Kind, cell(r.Resource), r.Holder, "-", "-", r.Heartbeat, heldFor, strconv.FormatInt(r.Waiters, 10)}
	}
	waiters := strconv.FormatInt(r.Waiters, 10)
	if r.NextHolder != nil {
		waiters += " (next: " + cell(*r.NextHolder) + ")"
	}
	return []string{
		r.Kind, cell(r.Resource), cell(r.Holder), strconv.FormatInt(deref(r.Token), 10), formatDuration(deref(r.ttlLeft)),
		r.Heartbeat + " (" + plural(deref(r.Renewals), "renewal", "renewals") + ")", heldFor, waiters,
	}
}

// writeTable writes header and rows aligned in columns two spaces apart, with no trailing
// spaces. Cells must not hold tabs or newlines (see cell).
func writeTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}
