import re,sys,lzma
def t(s):
    m,sec,ms,us=s.split('.'); return int(m)*60+int(sec)+int(ms)/1e3+int(us)/1e6
for f in sys.argv[1:]:
    cancel={}; d=[]
    for line in lzma.open(f,'rt',errors='replace'):
        m=re.match(r'(\d+\.\d+\.\d+\.\d+) W srv +stop: cancel task, id_task = (\d+)',line)
        if m: cancel[m.group(2)]=t(m.group(1)); continue
        m=re.match(r'(\d+\.\d+\.\d+\.\d+) I slot +release: id +\d+ \| task (\d+) \| stop processing',line)
        if m and m.group(2) in cancel: d.append((t(m.group(1))-cancel.pop(m.group(2)))*1000)
    d.sort(); N=len(d)
    p=lambda q:d[round((N-1)*q)]
    print(f, 'N',N,'cancel->release ms p50 %.2f p95 %.2f p99 %.2f max %.2f'%(p(.5),p(.95),p(.99),d[-1]))
