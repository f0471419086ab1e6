package rediscore

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

func TestParseOptions(t *testing.T) {
	q, _ := url.ParseQuery("prefix=app&node_timeout=20ms&drift_factor=0.02&max_key_len=64&token_retention=1h&fair=false&queue_ttl=500ms&other=1")
	o, err := ParseOptions(q)
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Prefix: "app", NodeTimeout: 20 * time.Millisecond, DriftFactor: 0.02, MaxKeyLen: 64, TokenRetention: time.Hour,
		Barging: true, QueueTTL: 500 * time.Millisecond}
	if o != want {
		t.Fatalf("got %+v want %+v", o, want)
	}
	if len(q) != 1 || q.Get("other") != "1" {
		t.Fatalf("left over %v, want only other", q)
	}
	o, err = ParseOptions(url.Values{})
	if err != nil || o != (Options{}).WithDefaults() || o.Barging || o.QueueTTL != DefaultQueueTTL {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, bad := range []string{"prefix=a{b", "prefix=", "node_timeout=x", "node_timeout=-1s", "drift_factor=0.7",
		"drift_factor=abc", "max_key_len=0", "token_retention=0s", "prefix=a&prefix=b",
		"fair=maybe", "fair=true&fair=false", "queue_ttl=10ms", "queue_ttl=0s"} {
		q, _ := url.ParseQuery(bad)
		if _, err := ParseOptions(q); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", bad, err)
		}
	}
}
