package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/idemkit/idempotency/coordinator"
)

// countEntry is the count of one operation; its JSON form is count -json's.
type countEntry struct {
	Operation string `json:"operation"`
	Total     int    `json:"total"`
	Pending   int    `json:"pending"`
	Completed int    `json:"completed"`
	// NotReplayable is how many of Completed completed with a result that
	// could not be kept.
	NotReplayable int `json:"not_replayable"`
	Unreadable    int `json:"unreadable"`
	Format1       int `json:"format1"`
}

// count counts the records per operation and state.
func (a *app) count(ctx context.Context, args []string) int {
	fs, o := a.newFlagSet("count", "count [flags] [operation...]")
	asJSON := fs.Bool("json", false, `print JSON: {"prefix": ..., "operations": [{"operation": ..., "total": ..., ...}]}`)
	ops, err := parse(fs, o, args)
	if err != nil {
		return parseStatus(err)
	}
	for _, op := range ops {
		if err := coordinator.ValidateOperation(op); err != nil {
			return a.usageError(fs, "%v", err)
		}
	}
	c, err := a.connect(ctx, o)
	if err != nil {
		return a.fail("count", err)
	}
	defer c.Close()
	entries, err := c.count(ctx, ops)
	if err != nil {
		return a.fail("count", err)
	}
	if *asJSON {
		out := struct {
			Prefix     *string      `json:"prefix,omitempty"`
			Table      string       `json:"table,omitempty"`
			Operations []countEntry `json:"operations"`
		}{Operations: entries}
		switch c := c.(type) {
		case *redisRecords:
			out.Prefix = &c.s.KeyPrefix
		case *pgRecords:
			out.Table = "idempotency_records"
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		err := enc.Encode(out)
		if err != nil {
			return a.fail("count", err)
		}
		return exitOK
	}
	if len(entries) == 0 {
		fmt.Fprintf(a.stdout, "no records %s\n", c.where())
		return exitOK
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "operation\ttotal\tpending\tcompleted\tnot_replayable\tunreadable\tformat1")
	var sum countEntry
	for _, e := range entries {
		printCount(w, e)
		sum.Total += e.Total
		sum.Pending += e.Pending
		sum.Completed += e.Completed
		sum.NotReplayable += e.NotReplayable
		sum.Unreadable += e.Unreadable
		sum.Format1 += e.Format1
	}
	if len(entries) > 1 {
		sum.Operation = "(all)"
		printCount(w, sum)
	}
	_ = w.Flush()
	return exitOK
}

func printCount(w *tabwriter.Writer, e countEntry) {
	fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", e.Operation, e.Total, e.Pending, e.Completed, e.NotReplayable, e.Unreadable, e.Format1)
}
