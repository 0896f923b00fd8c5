// SPDX-License-Identifier: GPL-2.0
/*
 * sch_aqm_mark: tcplab's `mark` queue for the DCTCP-flaws study (experiments/README.md#dctcp-flaws).
 *
 * One packet FIFO (limit in packets) that timestamps every packet at enqueue and decides at dequeue
 * (or, when on_dequeue is 0, at enqueue) whether to set CE with INET_ECN_set_ce():
 *   step: mark when the metric exceeds min_ns;
 *   ramp: mark with probability (metric - min_ns) / (max_ns - min_ns), clamped to [0, 1].
 * No averaging: the metric is instantaneous.
 *   sojourn: at dequeue, now - enqueue time of the packet being dequeued; at enqueue, the sojourn of
 *            the packet at the head of the queue (how long the oldest waiting packet has waited).
 *   est:     expected service time, backlog / drain rate: at dequeue the bytes still queued behind the
 *            dequeued packet, at enqueue the bytes queued ahead of the arriving one. The rate is
 *            rate_bytes_ps when configured (> 0; e.g. the parent htb's rate / 8), else the measured
 *            drain rate: a window opens at a dequeue that leaves at least AQM_MARK_DQ_START bytes
 *            queued and closes once AQM_MARK_DQ_WINDOW further bytes have been dequeued; the sample
 *            is those bytes over the time between the opening and the closing dequeue. A window in
 *            which the queue runs empty is discarded (idle time is not drain time). Samples are
 *            smoothed as rate = 7/8 rate + 1/8 sample (the first one is taken as is). Until a first
 *            sample exists est is 0 (nothing is marked).
 * Non-ECT packets are never marked and never dropped; the only drop is a packet arriving when
 * limit_packets are queued. Configuration: TCA_OPTIONS nested TCA_AQM_MARK_* attributes (below, and
 * schemas/qdiscs/mark_netlink.py on the userspace side); dump returns them; xstats: struct
 * tc_aqm_mark_xstats.
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/types.h>
#include <linux/skbuff.h>
#include <linux/ktime.h>
#include <linux/math64.h>
#include <linux/random.h>
#include <net/netlink.h>
#include <net/pkt_sched.h>
#include <net/inet_ecn.h>

enum {
	TCA_AQM_MARK_UNSPEC,
	TCA_AQM_MARK_MODE,		/* u32: 0 step, 1 ramp */
	TCA_AQM_MARK_METRIC,		/* u32: 0 sojourn, 1 est */
	TCA_AQM_MARK_MIN_NS,		/* u64 */
	TCA_AQM_MARK_MAX_NS,		/* u64 (ramp: > min_ns; step: ignored) */
	TCA_AQM_MARK_LIMIT,		/* u32 packets, >= 1 */
	TCA_AQM_MARK_ON_DEQUEUE,	/* u8: 1 decide at dequeue, 0 at enqueue */
	TCA_AQM_MARK_RATE,		/* u64 bytes/s for est; 0: measured drain rate */
	TCA_AQM_MARK_PAD,
	__TCA_AQM_MARK_MAX
};
#define TCA_AQM_MARK_MAX (__TCA_AQM_MARK_MAX - 1)

enum { AQM_MARK_STEP = 0, AQM_MARK_RAMP = 1 };
enum { AQM_MARK_SOJOURN = 0, AQM_MARK_EST = 1 };

struct tc_aqm_mark_xstats {
	__u64 packets;		/* packets offered to enqueue */
	__u64 marked;		/* decisions that left a packet CE */
	__u64 dropped;		/* dropped because limit_packets were queued */
	__u64 not_ect;		/* decisions to mark a non-ECT packet (passed unmarked) */
	__u64 drain_rate;	/* measured drain rate, bytes/s (0: no sample yet) */
};

#define AQM_MARK_DQ_START 3028u	/* bytes queued behind a dequeue to open a window (2 x 1514) */
#define AQM_MARK_DQ_WINDOW 10000u	/* bytes dequeued per drain-rate sample */

struct aqm_mark_cfg {
	u32 mode;
	u32 metric;
	u64 min_ns;
	u64 max_ns;
	u32 limit;
	u8 on_dequeue;
	u64 rate;		/* configured bytes/s, 0: measured */
};

struct aqm_mark_sched_data {
	struct aqm_mark_cfg cfg;
	/* drain-rate measurement */
	u64 dq_start;		/* ns, 0: not measuring */
	u64 dq_bytes;
	u64 drain_rate;		/* bytes/s */
	struct tc_aqm_mark_xstats st;
};

struct aqm_mark_skb_cb {
	u64 enq_ns;
};

static struct aqm_mark_skb_cb *aqm_mark_cb(const struct sk_buff *skb)
{
	qdisc_cb_private_validate(skb, sizeof(struct aqm_mark_skb_cb));
	return (struct aqm_mark_skb_cb *)qdisc_skb_cb(skb)->data;
}

static u64 aqm_mark_est_ns(const struct aqm_mark_sched_data *q, u64 bytes)
{
	u64 rate = q->cfg.rate ? q->cfg.rate : q->drain_rate;

	if (!rate)
		return 0;
	return div64_u64(bytes * NSEC_PER_SEC, rate);
}

static bool aqm_mark_decide(const struct aqm_mark_sched_data *q, u64 metric_ns)
{
	u64 span, delta, prob;

	if (metric_ns <= q->cfg.min_ns)
		return false;
	if (q->cfg.mode == AQM_MARK_STEP || metric_ns >= q->cfg.max_ns)
		return true;
	span = q->cfg.max_ns - q->cfg.min_ns;
	delta = metric_ns - q->cfg.min_ns;	/* < span */
	/* delta / span as a 32-bit fixed-point probability */
	if (span < (1ULL << 32))
		prob = div64_u64(delta << 32, span);
	else
		prob = div64_u64(delta, span >> 32);
	return (u64)get_random_u32() < prob;
}

static void aqm_mark_apply(struct aqm_mark_sched_data *q, struct sk_buff *skb, u64 metric_ns)
{
	if (!aqm_mark_decide(q, metric_ns))
		return;
	if (INET_ECN_set_ce(skb))
		q->st.marked++;
	else
		q->st.not_ect++;
}

static void aqm_mark_measure(struct aqm_mark_sched_data *q, u32 len, u64 backlog_after, u64 now)
{
	if (!q->dq_start) {
		if (backlog_after >= AQM_MARK_DQ_START) {
			q->dq_start = now;
			q->dq_bytes = 0;
		}
		return;
	}
	q->dq_bytes += len;
	if (q->dq_bytes >= AQM_MARK_DQ_WINDOW) {
		u64 dt = now - q->dq_start;

		if (dt) {
			u64 sample = div64_u64(q->dq_bytes * NSEC_PER_SEC, dt);

			q->drain_rate = q->drain_rate ? (7 * q->drain_rate + sample) >> 3 : sample;
		}
		q->dq_start = 0;
		q->dq_bytes = 0;
	} else if (!backlog_after) {
		q->dq_start = 0;	/* the queue ran empty: discard the window */
	}
}

static int aqm_mark_enqueue(struct sk_buff *skb, struct Qdisc *sch, struct sk_buff **to_free)
{
	struct aqm_mark_sched_data *q = qdisc_priv(sch);
	u64 now = ktime_get_ns();

	q->st.packets++;
	if (unlikely(sch->q.qlen >= q->cfg.limit)) {
		q->st.dropped++;
		return qdisc_drop(skb, sch, to_free);
	}
	aqm_mark_cb(skb)->enq_ns = now;
	if (!q->cfg.on_dequeue) {
		u64 metric = 0;

		if (q->cfg.metric == AQM_MARK_EST) {
			metric = aqm_mark_est_ns(q, sch->qstats.backlog);
		} else {
			struct sk_buff *head = qdisc_peek_head(sch);

			if (head)
				metric = now - aqm_mark_cb(head)->enq_ns;
		}
		aqm_mark_apply(q, skb, metric);
	}
	return qdisc_enqueue_tail(skb, sch);
}

static struct sk_buff *aqm_mark_dequeue(struct Qdisc *sch)
{
	struct aqm_mark_sched_data *q = qdisc_priv(sch);
	struct sk_buff *skb = qdisc_dequeue_head(sch);
	u64 now, after;

	if (!skb)
		return NULL;
	now = ktime_get_ns();
	after = sch->qstats.backlog;
	aqm_mark_measure(q, qdisc_pkt_len(skb), after, now);
	if (q->cfg.on_dequeue) {
		u64 metric;

		if (q->cfg.metric == AQM_MARK_EST)
			metric = aqm_mark_est_ns(q, after);
		else
			metric = now - aqm_mark_cb(skb)->enq_ns;
		aqm_mark_apply(q, skb, metric);
	}
	return skb;
}

static const struct nla_policy aqm_mark_policy[TCA_AQM_MARK_MAX + 1] = {
	[TCA_AQM_MARK_MODE]		= { .type = NLA_U32 },
	[TCA_AQM_MARK_METRIC]		= { .type = NLA_U32 },
	[TCA_AQM_MARK_MIN_NS]		= { .type = NLA_U64 },
	[TCA_AQM_MARK_MAX_NS]		= { .type = NLA_U64 },
	[TCA_AQM_MARK_LIMIT]		= { .type = NLA_U32 },
	[TCA_AQM_MARK_ON_DEQUEUE]	= { .type = NLA_U8 },
	[TCA_AQM_MARK_RATE]		= { .type = NLA_U64 },
};

#define AQM_MARK_FIELD(f) { offsetof(struct aqm_mark_cfg, f), sizeof_field(struct aqm_mark_cfg, f) }
static const struct { u8 offset, size; } aqm_mark_field[TCA_AQM_MARK_MAX + 1] = {
	[TCA_AQM_MARK_MODE]		= AQM_MARK_FIELD(mode),
	[TCA_AQM_MARK_METRIC]		= AQM_MARK_FIELD(metric),
	[TCA_AQM_MARK_MIN_NS]		= AQM_MARK_FIELD(min_ns),
	[TCA_AQM_MARK_MAX_NS]		= AQM_MARK_FIELD(max_ns),
	[TCA_AQM_MARK_LIMIT]		= AQM_MARK_FIELD(limit),
	[TCA_AQM_MARK_ON_DEQUEUE]	= AQM_MARK_FIELD(on_dequeue),
	[TCA_AQM_MARK_RATE]		= AQM_MARK_FIELD(rate),
};

/* Why a configuration is refused, or NULL */
static const char *aqm_mark_invalid(const struct aqm_mark_cfg *c)
{
	if (c->mode > AQM_MARK_RAMP)
		return "aqm_mark: mode must be 0 (step) or 1 (ramp)";
	if (c->metric > AQM_MARK_EST)
		return "aqm_mark: metric must be 0 (sojourn) or 1 (est)";
	if (!c->limit)
		return "aqm_mark: limit must be at least 1 packet";
	if (c->mode == AQM_MARK_RAMP && (c->max_ns <= c->min_ns || c->max_ns > S64_MAX))
		return "aqm_mark: ramp needs max_ns > min_ns";
	if (c->on_dequeue > 1)
		return "aqm_mark: on_dequeue must be 0 or 1";
	return NULL;
}

static int aqm_mark_change(struct Qdisc *sch, struct nlattr *opt, struct netlink_ext_ack *extack)
{
	struct aqm_mark_sched_data *q = qdisc_priv(sch);
	struct nlattr *tb[TCA_AQM_MARK_MAX + 1];
	struct aqm_mark_cfg c = q->cfg;
	unsigned int qlen, dropped = 0, i;
	const char *msg;
	int err;

	if (!opt)
		return 0;
	err = nla_parse_nested_deprecated(tb, TCA_AQM_MARK_MAX, opt, aqm_mark_policy, extack);
	if (err < 0)
		return err;
	/* each given attribute overwrites its field (host byte order; the policy checked the length) */
	for (i = TCA_AQM_MARK_MODE; i <= TCA_AQM_MARK_RATE; i++)
		if (tb[i])
			memcpy((u8 *)&c + aqm_mark_field[i].offset, nla_data(tb[i]), aqm_mark_field[i].size);

	msg = aqm_mark_invalid(&c);
	if (msg) {
		if (extack)
			extack->_msg = msg;	/* NL_SET_ERR_MSG wants a literal */
		return -EINVAL;
	}

	sch_tree_lock(sch);
	q->cfg = c;
	qlen = sch->q.qlen;
	while (sch->q.qlen > q->cfg.limit) {
		struct sk_buff *skb = __qdisc_dequeue_head(&sch->q);

		dropped += qdisc_pkt_len(skb);
		qdisc_qstats_backlog_dec(sch, skb);
		rtnl_qdisc_drop(skb, sch);
	}
	qdisc_tree_reduce_backlog(sch, qlen - sch->q.qlen, dropped);
	sch_tree_unlock(sch);
	return 0;
}

static int aqm_mark_init(struct Qdisc *sch, struct nlattr *opt, struct netlink_ext_ack *extack)
{
	struct aqm_mark_sched_data *q = qdisc_priv(sch);

	q->cfg = (struct aqm_mark_cfg){
		.mode = AQM_MARK_STEP, .metric = AQM_MARK_SOJOURN, .min_ns = NSEC_PER_MSEC,
		.limit = qdisc_dev(sch)->tx_queue_len ? : 1000, .on_dequeue = 1,
	};
	q->dq_start = 0;
	q->dq_bytes = 0;
	q->drain_rate = 0;
	memset(&q->st, 0, sizeof(q->st));
	return aqm_mark_change(sch, opt, extack);
}

static void aqm_mark_reset(struct Qdisc *sch)
{
	struct aqm_mark_sched_data *q = qdisc_priv(sch);

	qdisc_reset_queue(sch);
	q->dq_start = 0;
	q->dq_bytes = 0;
}

static int aqm_mark_dump(struct Qdisc *sch, struct sk_buff *skb)
{
	struct aqm_mark_sched_data *q = qdisc_priv(sch);
	struct nlattr *opts = nla_nest_start_noflag(skb, TCA_OPTIONS);

	if (!opts)
		goto nla_put_failure;
	if (nla_put_u32(skb, TCA_AQM_MARK_MODE, q->cfg.mode) ||
	    nla_put_u32(skb, TCA_AQM_MARK_METRIC, q->cfg.metric) ||
	    nla_put_u64_64bit(skb, TCA_AQM_MARK_MIN_NS, q->cfg.min_ns, TCA_AQM_MARK_PAD) ||
	    nla_put_u64_64bit(skb, TCA_AQM_MARK_MAX_NS, q->cfg.max_ns, TCA_AQM_MARK_PAD) ||
	    nla_put_u32(skb, TCA_AQM_MARK_LIMIT, q->cfg.limit) ||
	    nla_put_u8(skb, TCA_AQM_MARK_ON_DEQUEUE, q->cfg.on_dequeue) ||
	    nla_put_u64_64bit(skb, TCA_AQM_MARK_RATE, q->cfg.rate, TCA_AQM_MARK_PAD))
		goto nla_put_failure;
	return nla_nest_end(skb, opts);

nla_put_failure:
	nla_nest_cancel(skb, opts);
	return -1;
}

static int aqm_mark_dump_stats(struct Qdisc *sch, struct gnet_dump *d)
{
	struct aqm_mark_sched_data *q = qdisc_priv(sch);
	struct tc_aqm_mark_xstats st = q->st;

	st.drain_rate = q->drain_rate;
	return gnet_stats_copy_app(d, &st, sizeof(st));
}

static struct Qdisc_ops aqm_mark_qdisc_ops __read_mostly = {
	.id		= "aqm_mark",
	.priv_size	= sizeof(struct aqm_mark_sched_data),
	.enqueue	= aqm_mark_enqueue,
	.dequeue	= aqm_mark_dequeue,
	.peek		= qdisc_peek_head,
	.init		= aqm_mark_init,
	.reset		= aqm_mark_reset,
	.change		= aqm_mark_change,
	.dump		= aqm_mark_dump,
	.dump_stats	= aqm_mark_dump_stats,
	.owner		= THIS_MODULE,
};

static int __init aqm_mark_module_init(void)
{
	return register_qdisc(&aqm_mark_qdisc_ops);
}

static void __exit aqm_mark_module_exit(void)
{
	unregister_qdisc(&aqm_mark_qdisc_ops);
}

module_init(aqm_mark_module_init);
module_exit(aqm_mark_module_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("tcplab aqm_mark: CE marking on instantaneous sojourn or expected service time");
MODULE_AUTHOR("tcplab");
