package cutover

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// versions asks each instance for its version: all must answer the same.
func versions(ctx context.Context, addrs []string) []Condition {
	if len(addrs) == 0 {
		return nil
	}
	seen := map[string][]string{}
	var bad []string
	client := &http.Client{Timeout: 5 * time.Second}
	for _, a := range addrs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a+"/version", nil)
		if err != nil {
			bad = append(bad, a+": "+err.Error())
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			bad = append(bad, a+": unreachable")
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		resp.Body.Close()
		v := strings.TrimSpace(string(b))
		if resp.StatusCode != http.StatusOK || v == "" {
			// Not a relayd's answer (a relayd too old for /version, a
			// proxy's error page): error pages that agree prove nothing.
			bad = append(bad, fmt.Sprintf("%s: /version answered %s", a, resp.Status))
			continue
		}
		seen[v] = append(seen[v], a)
	}
	c := Condition{Name: CondInstances}
	var parts []string
	for v, as := range seen {
		parts = append(parts, fmt.Sprintf("%s on %s", v, strings.Join(as, ", ")))
	}
	c.OK = len(bad) == 0 && len(seen) == 1
	c.Detail = strings.Join(append(parts, bad...), "; ")
	return []Condition{c}
}
