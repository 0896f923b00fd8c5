// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * tcp_dctcp_flaws: DCTCP with the DCTCP-flaws study's switches as module parameters
 * (experiments/README.md#dctcp-flaws). Registers the congestion control "dctcp_flaws".
 *
 * The algorithm is Linux 6.1's net/ipv4/tcp_dctcp.c (linux-source-6.1 6.1.192, the VM lab guest's
 * series; authors below). With every parameter at its default it behaves as that file does. The
 * parameters (/sys/module/tcp_dctcp_flaws/parameters/):
 *
 *   g_shift     (0..10, default 4, writable)   EWMA gain g = 1/2^g_shift:
 *               alpha = (1 - g) alpha + g F, F the fraction of CE-marked bytes in the last window.
 *               Like upstream, the decay uses min_not_zero(alpha, alpha >> g_shift): once
 *               alpha >> g_shift is 0 the whole alpha is subtracted (the EWMA precision flaw).
 *   alpha_init  (0..1024, default 1024, writable)  alpha of a new connection, in 1/1024.
 *   alpha_bits  (10 or 20, default 10, load time only)  fixed-point bits alpha is kept in. 10 is
 *               upstream (the low end of the EWMA collapses to 0); 20 keeps 2^10 times the precision
 *               (the study's "alpha bits" variant). get_info (ss -ti `dctcp:(...alpha:N...)`) always
 *               reports alpha in 1/1024, whatever the internal precision.
 *   loss_halve  (bool, default Y, writable)  on entering fast recovery or on an RTO, set ssthresh to
 *               cwnd/2 as upstream does since Linux 5.1; N: reduce by alpha/2 as on a CE mark (the
 *               pre-5.1 behaviour the study's loss experiments compare).
 */
#include <linux/module.h>
#include <linux/mm.h>
#include <linux/math64.h>
#include <net/tcp.h>
#include <linux/inet_diag.h>

#define DCTCP_MAX_ALPHA_10 1024U

struct dctcp_flaws {
	u32 old_delivered;
	u32 old_delivered_ce;
	u32 prior_rcv_nxt;
	u32 alpha;		/* in 1/2^alpha_bits */
	u32 next_seq;
	u32 ce_state;
	u32 loss_cwnd;
};

static unsigned int g_shift __read_mostly = 4;
static unsigned int alpha_init __read_mostly = DCTCP_MAX_ALPHA_10;
static unsigned int alpha_bits __read_mostly = 10;
static bool loss_halve __read_mostly = true;

static int g_shift_set(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, 10);
}

static const struct kernel_param_ops g_shift_ops = {
	.set = g_shift_set,
	.get = param_get_uint,
};
module_param_cb(g_shift, &g_shift_ops, &g_shift, 0644);
MODULE_PARM_DESC(g_shift, "EWMA gain g = 1/2^g_shift (0..10, default 4)");

static int alpha_init_set(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, DCTCP_MAX_ALPHA_10);
}

static const struct kernel_param_ops alpha_init_ops = {
	.set = alpha_init_set,
	.get = param_get_uint,
};
module_param_cb(alpha_init, &alpha_init_ops, &alpha_init, 0644);
MODULE_PARM_DESC(alpha_init, "initial alpha in 1/1024 (0..1024, default 1024)");

static int alpha_bits_set(const char *val, const struct kernel_param *kp)
{
	unsigned int v;
	int ret = kstrtouint(val, 0, &v);

	if (ret)
		return ret;
	if (v != 10 && v != 20)
		return -EINVAL;
	*(unsigned int *)kp->arg = v;
	return 0;
}

static const struct kernel_param_ops alpha_bits_ops = {
	.set = alpha_bits_set,
	.get = param_get_uint,
};
module_param_cb(alpha_bits, &alpha_bits_ops, &alpha_bits, 0444);
MODULE_PARM_DESC(alpha_bits, "fixed-point bits of alpha: 10 (upstream) or 20; load time only");

module_param(loss_halve, bool, 0644);
MODULE_PARM_DESC(loss_halve, "on loss set ssthresh to cwnd/2 (Y, upstream) or reduce by alpha/2 (N)");

static struct tcp_congestion_ops dctcp_flaws_reno;

static inline u32 max_alpha(void)
{
	return 1U << alpha_bits;
}

static void dctcp_flaws_reset(const struct tcp_sock *tp, struct dctcp_flaws *ca)
{
	ca->next_seq = tp->snd_nxt;
	ca->old_delivered = tp->delivered;
	ca->old_delivered_ce = tp->delivered_ce;
}

static void dctcp_flaws_init(struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	if ((tp->ecn_flags & TCP_ECN_OK) ||
	    (sk->sk_state == TCP_LISTEN || sk->sk_state == TCP_CLOSE)) {
		struct dctcp_flaws *ca = inet_csk_ca(sk);

		ca->prior_rcv_nxt = tp->rcv_nxt;
		ca->alpha = min(alpha_init, DCTCP_MAX_ALPHA_10) << (alpha_bits - 10);
		ca->loss_cwnd = 0;
		ca->ce_state = 0;
		dctcp_flaws_reset(tp, ca);
		return;
	}
	/* No ECN: Reno, and no ECT on this socket (as upstream). */
	WRITE_ONCE(inet_csk(sk)->icsk_ca_ops, &dctcp_flaws_reno);
	INET_ECN_dontxmit(sk);
}

static u32 alpha_reduced(const struct tcp_sock *tp, const struct dctcp_flaws *ca)
{
	u64 cut = ((u64)tcp_snd_cwnd(tp) * ca->alpha) >> (alpha_bits + 1);

	return max(tcp_snd_cwnd(tp) - (u32)cut, 2U);
}

static u32 dctcp_flaws_ssthresh(struct sock *sk)
{
	struct dctcp_flaws *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	ca->loss_cwnd = tcp_snd_cwnd(tp);
	return alpha_reduced(tp, ca);
}

static void dctcp_flaws_update_alpha(struct sock *sk, u32 flags)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct dctcp_flaws *ca = inet_csk_ca(sk);

	if (!before(tp->snd_una, ca->next_seq)) {
		u64 delivered_ce = tp->delivered_ce - ca->old_delivered_ce;
		u32 alpha = ca->alpha;

		/* alpha = (1 - g) * alpha + g * F */
		alpha -= min_not_zero(alpha, alpha >> g_shift);
		if (delivered_ce) {
			u32 delivered = tp->delivered - ca->old_delivered;

			delivered_ce <<= (alpha_bits - g_shift);
			delivered_ce = div_u64(delivered_ce, max(1U, delivered));
			alpha = (u32)min_t(u64, alpha + delivered_ce, max_alpha());
		}
		WRITE_ONCE(ca->alpha, alpha);
		dctcp_flaws_reset(tp, ca);
	}
}

static void dctcp_flaws_react_to_loss(struct sock *sk)
{
	struct dctcp_flaws *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	ca->loss_cwnd = tcp_snd_cwnd(tp);
	tp->snd_ssthresh = loss_halve ? max(tcp_snd_cwnd(tp) >> 1U, 2U) : alpha_reduced(tp, ca);
}

static void dctcp_flaws_state(struct sock *sk, u8 new_state)
{
	if (new_state == TCP_CA_Recovery && new_state != inet_csk(sk)->icsk_ca_state)
		dctcp_flaws_react_to_loss(sk);
}

/* net/ipv4/tcp_dctcp.h of 6.1, renamed */
static void dctcp_flaws_ece_ack_cwr(struct sock *sk, u32 ce_state)
{
	struct tcp_sock *tp = tcp_sk(sk);

	if (ce_state == 1)
		tp->ecn_flags |= TCP_ECN_DEMAND_CWR;
	else
		tp->ecn_flags &= ~TCP_ECN_DEMAND_CWR;
}

static void dctcp_flaws_ece_ack_update(struct sock *sk, enum tcp_ca_event evt, u32 *prior_rcv_nxt,
				       u32 *ce_state)
{
	u32 new_ce_state = (evt == CA_EVENT_ECN_IS_CE) ? 1 : 0;

	if (*ce_state != new_ce_state) {
		if (inet_csk(sk)->icsk_ack.pending & ICSK_ACK_TIMER) {
			dctcp_flaws_ece_ack_cwr(sk, *ce_state);
			__tcp_send_ack(sk, *prior_rcv_nxt);
		}
		inet_csk(sk)->icsk_ack.pending |= ICSK_ACK_NOW;
	}
	*prior_rcv_nxt = tcp_sk(sk)->rcv_nxt;
	*ce_state = new_ce_state;
	dctcp_flaws_ece_ack_cwr(sk, new_ce_state);
}

static void dctcp_flaws_cwnd_event(struct sock *sk, enum tcp_ca_event ev)
{
	struct dctcp_flaws *ca = inet_csk_ca(sk);

	switch (ev) {
	case CA_EVENT_ECN_IS_CE:
	case CA_EVENT_ECN_NO_CE:
		dctcp_flaws_ece_ack_update(sk, ev, &ca->prior_rcv_nxt, &ca->ce_state);
		break;
	case CA_EVENT_LOSS:
		dctcp_flaws_react_to_loss(sk);
		break;
	default:
		break;
	}
}

static size_t dctcp_flaws_get_info(struct sock *sk, u32 ext, int *attr, union tcp_cc_info *info)
{
	const struct dctcp_flaws *ca = inet_csk_ca(sk);
	const struct tcp_sock *tp = tcp_sk(sk);

	if (ext & (1 << (INET_DIAG_DCTCPINFO - 1)) || ext & (1 << (INET_DIAG_VEGASINFO - 1))) {
		memset(&info->dctcp, 0, sizeof(info->dctcp));
		if (READ_ONCE(inet_csk(sk)->icsk_ca_ops) != &dctcp_flaws_reno) {
			info->dctcp.dctcp_enabled = 1;
			info->dctcp.dctcp_ce_state = (u16)ca->ce_state;
			info->dctcp.dctcp_alpha = READ_ONCE(ca->alpha) >> (alpha_bits - 10);
			info->dctcp.dctcp_ab_ecn = tp->mss_cache * (tp->delivered_ce - ca->old_delivered_ce);
			info->dctcp.dctcp_ab_tot = tp->mss_cache * (tp->delivered - ca->old_delivered);
		}
		*attr = INET_DIAG_DCTCPINFO;
		return sizeof(info->dctcp);
	}
	return 0;
}

static u32 dctcp_flaws_cwnd_undo(struct sock *sk)
{
	const struct dctcp_flaws *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	return max(tcp_snd_cwnd(tp), ca->loss_cwnd);
}

static struct tcp_congestion_ops dctcp_flaws __read_mostly = {
	.init		= dctcp_flaws_init,
	.in_ack_event	= dctcp_flaws_update_alpha,
	.cwnd_event	= dctcp_flaws_cwnd_event,
	.ssthresh	= dctcp_flaws_ssthresh,
	.cong_avoid	= tcp_reno_cong_avoid,
	.undo_cwnd	= dctcp_flaws_cwnd_undo,
	.set_state	= dctcp_flaws_state,
	.get_info	= dctcp_flaws_get_info,
	.flags		= TCP_CONG_NEEDS_ECN,
	.owner		= THIS_MODULE,
	.name		= "dctcp_flaws",
};

static struct tcp_congestion_ops dctcp_flaws_reno __read_mostly = {
	.ssthresh	= tcp_reno_ssthresh,
	.cong_avoid	= tcp_reno_cong_avoid,
	.undo_cwnd	= tcp_reno_undo_cwnd,
	.get_info	= dctcp_flaws_get_info,
	.owner		= THIS_MODULE,
	.name		= "dctcp_flaws-reno",
};

static int __init dctcp_flaws_register(void)
{
	BUILD_BUG_ON(sizeof(struct dctcp_flaws) > ICSK_CA_PRIV_SIZE);
	return tcp_register_congestion_control(&dctcp_flaws);
}

static void __exit dctcp_flaws_unregister(void)
{
	tcp_unregister_congestion_control(&dctcp_flaws);
}

module_init(dctcp_flaws_register);
module_exit(dctcp_flaws_unregister);

MODULE_AUTHOR("Daniel Borkmann <dborkman@redhat.com>");
MODULE_AUTHOR("Florian Westphal <fw@strlen.de>");
MODULE_AUTHOR("Glenn Judd <glenn.judd@morganstanley.com>");
MODULE_AUTHOR("tcplab (the DCTCP-flaws switches)");
MODULE_LICENSE("GPL v2");
MODULE_DESCRIPTION("DCTCP with the DCTCP-flaws study's switches as module parameters");
