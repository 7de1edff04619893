/* log.h - one line per notable event on stderr, with a UTC timestamp. */
#ifndef RD_DAEMON_LOG_H
#define RD_DAEMON_LOG_H

void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
