mod proto;
