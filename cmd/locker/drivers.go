package main

// The backends the command can reach, by URL scheme. A driver is wired in by
// a blank import.
import (
	_ "github.com/go-locker/locker/drivers/etcd"     // etcd://
	_ "github.com/go-locker/locker/drivers/file"     // file://
	_ "github.com/go-locker/locker/drivers/mem"      // mem://
	_ "github.com/go-locker/locker/drivers/postgres" // postgres://, postgresql://
	_ "github.com/go-locker/locker/drivers/redis"    // redis://, rediss://
	_ "github.com/go-locker/locker/drivers/rueidis"  // rueidis://
)
